"""`bench throughput`'s long reads saved as they go (kvpot.bench.read_checkpoint): a read stopped after a
save and gone on with in a fresh engine ends with the pot one uninterrupted read leaves, bit for bit; a
file that is not a saved read, or another read's, is one clear error; and through the CLI a run stopped
with Ctrl-C says how to go on, and goes on with --resume, keeping the parts it had finished."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from kvpot.bench.read_checkpoint import Stop, drop, timed_read
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import make_policy
from kvpot.runtime.cpu import describe_host
from kvpot.session.context_file import read_context
from kvpot.state.state_container import read_state, write_state

N = 1200
KEY = {"read": "test"}


def _engine(path, spec: str) -> Engine:
    return Engine(str(path), make_policy(spec), EngineConfig(budget=128, chunk=64, n_threads=2))


def _state(eng: Engine) -> dict:
    """Everything a saved context holds of the engine, but the time compaction took (NaN, a log p not yet
    known, as a word: NaN is not equal to itself)."""
    st = eng.export_state()
    values = {k: "nan" if isinstance(v, float) and math.isnan(v) else v
              for k, v in st.values.items() if k != "compact_seconds"}
    return {"seq": bytes(st.seq), "pot": st.pot, "values": values,
            "arrays": {k: (a.dtype.str, a.shape, a.tobytes()) for k, a in st.arrays.items()}}


def _stopped_read(path, spec, save, after_saves: int):
    """A read saved after every chunk and stopped right after its `after_saves`-th save."""
    seen = []

    def stop(so_far):
        seen.append(so_far)
        if len(seen) == after_saves:
            raise Stop

    with _engine(path, spec) as eng, pytest.raises(Stop):
        timed_read(eng, N, KEY, save, every=0.0, on_saved=stop)
    return seen


# InfiniPot (the NuC head's scores in the engine), H2O (accumulated scores in the policy's state) and
# IMDC (chunks planned from the length told when the read began, which a resumed read does not tell
# again); Gemma as well, whose BOS is a token of the read but not of the generated text
@pytest.mark.parametrize("model, spec", [("smollm2_cut_path", "infinipot"), ("smollm2_cut_path", "h2o"),
                                         ("smollm2_cut_path", "imdc:pruner=snapkv,m_0=40"),
                                         ("gemma_cut_path", "infinipot")])
def test_a_stopped_read_goes_on_to_the_pot_one_read_leaves(request, tmp_path, model, spec):
    model_path = request.getfixturevalue(model)
    with _engine(model_path, spec) as ref:
        whole = timed_read(ref, N, KEY)
        want = _state(ref)
    assert whole.parts == 1 and whole.saves == 0 and whole.tokens == N
    save = tmp_path / "read.kvstate"
    seen = _stopped_read(model_path, spec, save, after_saves=5)
    stopped_at = seen[-1].tokens
    assert save.exists() and 0 < stopped_at < N and [s.saves for s in seen] == [1, 2, 3, 4, 5]
    with _engine(model_path, spec) as eng:
        rest = timed_read(eng, N, KEY, save, every=1e9)
        assert eng.n_compactions > 0
        assert _state(eng) == want
    assert rest.parts == 2 and rest.saves == 5 and rest.tokens == N
    assert rest.cpus == [describe_host()] * 2  # each part's machine, since a read in parts may span several
    # the reading time of both parts; the peak RSS the larger of both parts' reading peaks
    assert rest.seconds > seen[-1].seconds > 0 and rest.peak_rss_mb >= seen[-1].peak_rss_mb > 0
    assert rest.rss_start_mb == seen[0].rss_start_mb and rest.kv_bytes >= seen[-1].kv_bytes > 0


def test_a_file_that_is_not_this_reads_save_is_refused(smollm2_cut_path, tmp_path):
    save = tmp_path / "read.kvstate"
    _stopped_read(smollm2_cut_path, "streaming", save, after_saves=1)
    with _engine(smollm2_cut_path, "streaming") as eng:
        with pytest.raises(KvpotError, match=r"was saved by another read \(read 'test', not 'other'\); delete it"):
            timed_read(eng, N, {"read": "other"}, save)
        save.write_bytes(save.read_bytes()[:-100])  # cut short, as a full disk or a crash mid-copy leaves it
        with pytest.raises(KvpotError, match=r"bench checkpoint .* is truncated or corrupted \(checksum mismatch\); "
                                             r"delete it to read from the start"):
            timed_read(eng, N, KEY, save)
        assert eng.tokens_seen == 0  # nothing of either was restored


def test_dropping_a_save_removes_what_a_killed_save_left(tmp_path):
    """A case killed while it saved (SIGKILL: no handler runs) leaves the save's temporary file; once the
    read's figures are kept, both go."""
    save = tmp_path / "read-0123.kvstate"
    save.write_bytes(b"saved")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    left = tmp_path / f".{save.name}.{dead.stdout.strip()}.0a1b2c3d.tmp"
    left.write_bytes(b"half a save")
    mine = tmp_path / f".{save.name}.{os.getpid()}.0a1b2c3d.tmp"  # a writer that runs keeps its file
    mine.write_bytes(b"being written")
    drop(save)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]


@pytest.mark.parametrize("field, value", [("tokens", "1200"), ("seconds", -1.0), ("cpus", [3]), ("parts", True)])
def test_a_save_whose_figures_are_of_another_type_is_refused(smollm2_cut_path, tmp_path, field, value):
    """A right checksum over a crafted or hand-edited header: its figures are checked before they are used."""
    save = tmp_path / "read.kvstate"
    _stopped_read(smollm2_cut_path, "streaming", save, after_saves=1)
    meta, state = read_state(save, "bench checkpoint")
    meta["so_far"][field] = value
    write_state(save, meta, state, "bench checkpoint")
    with _engine(smollm2_cut_path, "streaming") as eng:
        with pytest.raises(KvpotError, match=rf"bench checkpoint .* is malformed \(ValueError: so_far\.{field} is .*\); "
                                             r"delete it to read from the start"):
            timed_read(eng, N, KEY, save)
        assert eng.tokens_seen == 0


def test_a_save_and_a_saved_context_are_told_apart(smollm2_cut_path, tmp_path):
    """Both are kvpot.state.state_container files: each reader names the other kind instead of reading it."""
    save = tmp_path / "read.kvstate"
    _stopped_read(smollm2_cut_path, "streaming", save, after_saves=1)
    with pytest.raises(KvpotError, match=r"saved context .* is malformed: header field format is 'kvpot bench read': "
                                         r"not a saved context"):
        read_context(save)
    ctx = tmp_path / "doc.kvctx"
    with _engine(smollm2_cut_path, "streaming") as eng:
        _, state = read_state(save, "bench checkpoint")
        write_state(ctx, {"format": "kvpot saved context"}, state, "context")
        with pytest.raises(KvpotError, match=r"is not a kvpot bench checkpoint \(it is a 'kvpot saved context'\); "
                                             r"delete it"):
            timed_read(eng, N, KEY, ctx)
        assert eng.tokens_seen == 0


def test_a_run_stopped_with_ctrl_c_goes_on_with_resume(smollm2_cut_path, tmp_path):
    from conftest import interrupt_once_saved

    out = tmp_path / "tp.json"
    env = dict(os.environ, KVPOT_HOME=str(tmp_path / "home"), COLUMNS="200")
    # its own kvpot home, so no unpatched build (test_stock_upstream covers that part, in the shared home)
    args = ["bench", "throughput", "-m", str(smollm2_cut_path), "--no-upstream", "--tokens", "512", "--stock-tokens", "256",
            "--budget", "128", "--chunk", "64", "--decode", "0", "--json", str(out)]
    first = subprocess.run([sys.executable, "-c", "from kvpot.cli.main import main; main()", *args],
                           env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    short = json.loads(out.read_text())
    # a longer read added, and stopped: the parts done before are still in the file
    # long enough that the interrupt lands mid-read even when this process is slow to send it (a loaded
    # machine): with 4,096 tokens a read could end, and its save go, between the poll and the signal
    longer = [*args, "--tokens", "16384", "--resume"]
    stopped = interrupt_once_saved([*longer, "--save-every", "0"], env, tmp_path / "home" / "bench-reads", "read-*.kvstate")
    assert stopped.returncode == 130
    assert f"the parts done are in {out}; the same command with --resume goes on" in stopped.stderr
    kept = json.loads(out.read_text())
    assert (kept["stock"], kept["pot"]) == (short["stock"], short["pot"])
    res = subprocess.run([sys.executable, "-c", "from kvpot.cli.main import main; main()", *longer],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    stock, pot = data["stock"], data["pot"][1]
    assert stock == short["stock"] and data["pot"][0] == short["pot"][0]  # kept, not measured again
    assert pot["tokens"] == 16384 and pot["read_parts"] == 2 == len(pot["read_cpus"]) and pot["read_saves"] >= 1
    assert pot["compactions"] > 0 and pot["ratio_vs_stock"] == pytest.approx(pot["tok_s"] / stock["tok_s"])
    assert short["pot"][0]["read_parts"] == 1
    assert list((tmp_path / "home" / "bench-reads").glob("*")) == []  # the save went once the figures were kept


def test_resume_refuses_a_file_of_another_plan(smollm2_cut_path, tmp_path):
    from conftest import assert_one_line_error, run_cli

    out = tmp_path / "tp.json"
    common = ["bench", "throughput", "-m", str(smollm2_cut_path), "--no-upstream", "--tokens", "256", "--stock-tokens", "256",
              "--chunk", "64", "--decode", "0", "--json", str(out)]
    env = {"KVPOT_HOME": str(tmp_path / "home")}
    assert run_cli(*common, "--budget", "128", env=env).returncode == 0
    res = run_cli(*common, "--budget", "192", "--resume", env=env)
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "was written with budget 128, not 192")
    out.write_text("[1, 2]")
    res = run_cli(*common, "--budget", "128", "--resume", env=env)
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "is not a `bench throughput` results file")


def test_what_a_save_holds_for_a_moment_is_not_the_readings_peak():
    """ReadingPeak: memory held only between the end of a stretch and its restart (a save's copy of the
    state) is left out of the peak where the peak can be reset (Linux, Android), and counted where it
    cannot; memory a later stretch holds is counted either way."""
    import numpy as np

    from kvpot.bench.process import ReadingPeak, peak_rss_mb, reset_peak_rss

    peak = ReadingPeak()
    resets = reset_peak_rss()  # whether this platform can (restart tries it the same way)
    peak.restart(0.0)  # a stretch from here, whatever this test process held before
    base = peak.now()
    held = np.ones(160 * 2**20, dtype=np.uint8)  # 160 MiB, every page touched: a save's copy of the state
    del held
    peak.restart(base)
    after = peak.now()
    if not resets:  # the process's peak is all there is, what the save held included
        assert after == max(0.0, peak_rss_mb())
        return
    assert base <= after < base + 100
    later = np.ones(120 * 2**20, dtype=np.uint8)  # the reading holding more: counted
    assert peak.now() >= after + 110
    del later


def test_resume_measures_again_what_another_cpu_measured_while_a_read_is_left(monkeypatch):
    """A ratio to stock compares figures of one CPU: resumed on another machine with a read still to do, the
    kept stock part and the kept reads measured elsewhere (or on a CPU not recorded) are measured again, and
    those of this CPU are kept; a run with every part done keeps everything and runs nothing."""
    from kvpot.bench import throughput as tp

    runs = []

    def fake_worker(args, on_progress=None):
        runs.append((args[0], int(args[2])))
        if args[0] == "stock-prefill":
            return {"mode": "stock", "tokens": int(args[2]), "tok_s": 300.0}
        return {"mode": "pot", "tokens": int(args[2]), "tok_s": 150.0, "read_cpus": [tp.describe_host()]}

    monkeypatch.setattr(tp, "run_worker", fake_worker)
    plan = tp.ThroughputPlan(model="m.gguf", policy="snapkv", budget=2048, chunk=512, threads=2, flash_attn=False,
                             pot_tokens=(8192, 32768, 1048576), stock_tokens=2048, upstream=False)
    here, there = tp.describe_host(), "AMD EPYC"
    elsewhere = {"stock": {"tokens": 2048, "tok_s": 250.0, "cpu": there},
                 "pot": [{"tokens": 8192, "tok_s": 120.0, "read_cpus": [there]},
                         {"tokens": 32768, "tok_s": 110.0, "read_cpus": [here]}]}
    out = tp.run_plan(plan, done=json.loads(json.dumps(elsewhere)))
    assert runs == [("stock-prefill", 2048), ("kvpot-ingest", 8192), ("kvpot-ingest", 1048576)]
    assert out["stock"] == {"mode": "stock", "tokens": 2048, "tok_s": 300.0, "cpu": here}
    assert [r["tok_s"] for r in out["pot"]] == [150.0, 110.0, 150.0]  # this CPU's 32K read kept
    assert [r["ratio_vs_stock"] for r in out["pot"]] == pytest.approx([0.5, 110.0 / 300.0, 0.5])
    runs.clear()  # unrecorded stock CPU (a file written before parts recorded it): measured again
    tp.run_plan(plan, done={"stock": {"tokens": 2048, "tok_s": 250.0}, "pot": []})
    assert runs[0] == ("stock-prefill", 2048) and len(runs) == 4
    runs.clear()  # every part done on another CPU: nothing to do, nothing measured again
    whole = json.loads(json.dumps(elsewhere))
    whole["pot"].append({"tokens": 1048576, "tok_s": 100.0, "read_cpus": [there, there]})
    assert tp.run_plan(plan, done=whole)["stock"]["cpu"] == there and runs == []
