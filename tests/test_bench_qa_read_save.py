"""`bench qa` readings saved as they go (kvpot.bench.qa_read_save): a reading stopped and gone on from its
save answers as the same reading uninterrupted does (the reference: that reading, run in this test), a
save that cannot be used is said and the reading starts again, and the CLI stops on Ctrl-C after a
save and goes on with --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvpot.bench.qa import Plan, run
from kvpot.bench.qa_questions import load_set
from kvpot.bench.qa_read_save import QaReadStopped, QaSaves

# InfiniPot question first (CaP-Q, as `kvpot ask` reads past the window): 4,096 tokens in chunks of 512
# through 1,024 cells, so the reading compacts several times and is stopped between compactions
POT = dict(policies=["infinipot"], lengths=[4096], group=1, multikey=False, budget=1024, per_question=True)
SAME = ("answer", "tokens", "compactions", "resolved_policy", "budget", "correct")


@pytest.fixture(scope="module")
def question():
    return load_set().questions[:1]


@pytest.fixture(scope="module")
def whole(smollm2_cut_path, question):
    """The reading uninterrupted, no saves."""
    (r,) = run(Plan(model=str(smollm2_cut_path), **POT), question)
    assert r["compactions"] >= 3, r
    return r


def _stop_after(n: int):
    """A stop() that turns true at its n-th call (it is asked once before the reading and after each chunk)."""
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] >= n
    return stop


def test_a_stopped_reading_goes_on_from_its_save_to_the_same_answer(smollm2_cut_path, question, whole, tmp_path):
    plan = Plan(model=str(smollm2_cut_path), **POT)
    saves = QaSaves(tmp_path / "saves", every=3600.0)
    said: list[str] = []
    with pytest.raises(QaReadStopped) as stopped:
        run(plan, question, saves=saves, stop=_stop_after(4), say=said.append)
    e = stopped.value
    assert e.saved is not None and e.saved.is_file() and e.saved.with_suffix(".json").is_file()
    assert 0 < e.tokens < whole["tokens"]
    meta = json.loads(e.saved.with_suffix(".json").read_text())
    assert meta["so_far"]["tokens"] == e.tokens and meta["so_far"]["parts"] == 1
    lines: list[str] = []
    (r,) = run(plan, question, saves=saves, say=said.append, on_read=lines.append)
    assert {k: r[k] for k in SAME} == {k: whole[k] for k in SAME}
    # the part gone on from the save starts past its tokens, and says the rate of what it reads
    assert not any(f"read {n:,} of" in line for line in lines for n in range(1, e.tokens + 1)), lines
    assert r["read_parts"] == 2 and len(r["read_cpus"]) == 2
    assert r["read_seconds"] > meta["so_far"]["seconds"] > 0
    assert any(f"going on from the save of its first {e.tokens:,} tokens" in m for m in said), said
    assert list((tmp_path / "saves").iterdir()) == []  # the case is kept: its save is gone


def test_saving_after_every_chunk_reads_as_one_reading(smollm2_cut_path, question, whole, tmp_path, monkeypatch):
    """Each save stops the reading and goes on from its read point in the same process: the chunks, the
    compactions and the answer are those of the reading with no save, also where a save falls after the
    last chunk."""
    from kvpot.bench.qa_read_save import QaReadSave

    saved_at: list[int] = []
    real_save = QaReadSave.save
    monkeypatch.setattr(QaReadSave, "save", lambda self, s, so_far: (saved_at.append(so_far.tokens),
                                                                     real_save(self, s, so_far))[1])
    (r,) = run(Plan(model=str(smollm2_cut_path), **POT), question, saves=QaSaves(tmp_path / "saves", every=0.0))
    assert len(saved_at) >= whole["tokens"] // 512 - 1 and saved_at == sorted(set(saved_at)), saved_at
    assert {k: r[k] for k in SAME} == {k: whole[k] for k in SAME}
    assert "read_parts" not in r
    assert list((tmp_path / "saves").iterdir()) == []


@pytest.mark.parametrize("damage", ["figures", "context", "tokens"])
def test_a_save_that_cannot_be_used_is_said_and_the_reading_starts_again(smollm2_cut_path, question, whole,
                                                                         tmp_path, damage):
    plan = Plan(model=str(smollm2_cut_path), **POT)
    saves = QaSaves(tmp_path / "saves", every=3600.0)
    with pytest.raises(QaReadStopped) as stopped:
        run(plan, question, saves=saves, stop=_stop_after(4))
    ctx = stopped.value.saved
    figures = ctx.with_suffix(".json")
    if damage == "figures":
        figures.write_text("{not json")
    elif damage == "context":
        ctx.write_bytes(ctx.read_bytes()[:1000])
    else:  # a pair of files from two saves (a signal between their writes)
        meta = json.loads(figures.read_text())
        meta["so_far"]["tokens"] += 512
        figures.write_text(json.dumps(meta))
    said: list[str] = []
    (r,) = run(plan, question, saves=saves, say=said.append)
    assert any("cannot be" in m and "reading from the start" in m for m in said), said
    assert {k: r[k] for k in SAME} == {k: whole[k] for k in SAME} and "read_parts" not in r
    assert list((tmp_path / "saves").iterdir()) == []


def test_without_resume_an_old_save_is_dropped_and_the_reading_starts_again(smollm2_cut_path, question, whole,
                                                                             tmp_path):
    plan = Plan(model=str(smollm2_cut_path), **POT)
    with pytest.raises(QaReadStopped):
        run(plan, question, saves=QaSaves(tmp_path / "saves", every=3600.0), stop=_stop_after(4))
    (r,) = run(plan, question, saves=QaSaves(tmp_path / "saves", every=3600.0, resume=False))
    assert "read_parts" not in r and r["answer"] == whole["answer"]


def test_cli_ctrl_c_saves_the_reading_and_resume_goes_on(smollm2_cut_path, tmp_path):
    from conftest import interrupt_once_saved

    out = tmp_path / "qa.json"
    home = tmp_path / "home"
    env = dict(os.environ, KVPOT_HOME=str(home), COLUMNS="200")
    # long enough that the interrupt lands mid-read even when this process is slow to send it
    args = ["bench", "qa", "-m", str(smollm2_cut_path), "-P", "infinipot", "--budget", "1024", "--per-question",
            "--length", "16384", "--limit", "1", "--no-multikey", "--no-closed-book", "--json", str(out)]
    stopped = interrupt_once_saved([*args, "--save-every", "0"], env, home / "bench-reads", "qa-*.kvpot")
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert "the same command with --resume goes on from there" in stopped.stderr, stopped.stderr
    res = subprocess.run([sys.executable, "-c", "from kvpot.cli.main import main; main()", *args, "--resume"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (case,) = json.loads(out.read_text())
    assert case["read_parts"] == 2 and case["compactions"] > 0
    assert list((home / "bench-reads").iterdir()) == []
