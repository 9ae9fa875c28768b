"""Reopened contexts meet the checks a fresh read meets: the memory the saved context takes,
the machine's cores, a read that stopped early on a stream, inputs changed since they were read
(--sources), and InfLLM's disk check and store."""

from __future__ import annotations

import copy
import os
import stat
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.ingest.sources import STDIN, Mark, Source, SourceSet
from kvpot.locator.sources import CHANGED, UNCHECKED, Passage, SourceMap, format_passages, quote
from kvpot.models.gguf_file import read_model_facts
from kvpot.policies import make_policy
from kvpot.session.context_file import SavedContext, read_context, write_context
from kvpot.session.session import ReadingStopped, Session
from kvpot.session.settings import RunSettings

SMALL = RunSettings(policy="h2o", budget=64, chunk=32, threads=1, prompt="completion", max_tokens=2)
runner = CliRunner()


@pytest.fixture(scope="module")
def saved(smollm2_path, tmp_path_factory) -> tuple[SavedContext, Path]:
    folder = tmp_path_factory.mktemp("ctx")
    doc = folder / "doc.txt"
    doc.write_text(logbook()[0][:1200])
    with Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check()) as s:
        s.read(collect_sources([str(doc)]))
        s.save(folder / "good.kvctx")
    return read_context(folder / "good.kvctx"), folder


def _crafted(saved: SavedContext, path: Path, **header) -> Path:
    c = SavedContext(header=copy.deepcopy(saved.header), state=copy.deepcopy(saved.state))
    for key, value in header.items():
        target = c.header
        *parents, last = key.split("__")
        for k in parents:
            target = target[k]
        target[last] = value
    write_context(path, c)  # the checksum recomputed: only the checks behind it can refuse
    return path


@pytest.fixture
def no_load(monkeypatch):
    """Loading the model fails the test: what is refused must be refused before it."""
    from kvpot.session.session import Session

    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Session, "reopen", load)


def _one_error(res, needle: str) -> str:
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert needle in lines[0], lines[0]
    return lines[0]


# -- 14: a saved context's memory is checked as a fresh read's ------------------------------------------

@pytest.mark.parametrize("cells, memory", [(300_000, "4GiB"), (60_000, "1GiB")])
def test_a_context_larger_than_the_memory_is_refused_before_loading(saved, tmp_path, monkeypatch, no_load,
                                                                     cells, memory):
    ctx, _ = saved
    path = _crafted(ctx, tmp_path / "big.kvctx", n_ctx=cells)
    monkeypatch.setenv("KVPOT_DEVICE_MEMORY", memory)
    for cmd in (["ask", "--context", str(path), "what?"], ["chat", "--context", str(path)]):
        line = _one_error(runner.invoke(app, cmd), f"holds a context of {cells:,} cells")
        assert "is available here (KVPOT_DEVICE_MEMORY)" in line and "read the files again" in line


def test_a_fresh_read_of_the_same_size_is_refused_too(saved, tmp_path, monkeypatch, no_load):
    """The same memory (1 GiB) refuses a fresh -b 60000: the reopened context is held to the same check."""
    _, folder = saved
    monkeypatch.setenv("KVPOT_DEVICE_MEMORY", "1GiB")
    res = runner.invoke(app, ["ask", str(folder / "doc.txt"), "what?", "-m", "smollm2-135m", "-b", "60000",
                              "-P", "h2o"])
    _one_error(res, "is available")


def test_a_context_that_fits_reopens(saved, tmp_path, monkeypatch):
    ctx, _ = saved
    monkeypatch.setenv("KVPOT_DEVICE_MEMORY", "4GiB")
    res = runner.invoke(app, ["ask", "--context", str(_crafted(ctx, tmp_path / "c.kvctx")), "what?"])
    assert "reopened" in res.output and "error:" not in res.output, res.output  # (exit 5: two tokens, no answer)


# -- 21: threads from a saved context (or the config file) at most the machine's cores -------------------

def test_saved_threads_are_lowered_to_the_cores(saved, tmp_path, monkeypatch):
    import kvpot.session.checks as checks
    from kvpot.session.session import Session

    ctx, _ = saved
    path = _crafted(ctx, tmp_path / "t.kvctx", settings__threads=512)
    monkeypatch.setattr(checks, "cpu_cores", lambda: 2)
    got = {}

    def reopen(path, facts, name, threads, **k):
        got["threads"] = threads
        raise KvpotError("stop here")

    monkeypatch.setattr(Session, "reopen", reopen)
    res = runner.invoke(app, ["ask", "--context", str(path), "what?"])
    assert got.get("threads") == 2, res.output
    assert "asks for 512 threads; this machine has 2 CPU cores: using 2" in res.output
    # --threads given is checked as on a fresh read: more than the cores is refused
    res = runner.invoke(app, ["ask", "--context", str(path), "what?", "--threads", "3"])
    _one_error(res, "--threads 3 is more than the 2 CPU cores")


def test_config_threads_are_lowered_to_the_cores(saved, tmp_path, monkeypatch, smollm2_path):
    import kvpot.api.plan as cs
    import kvpot.session.checks as checks

    _, folder = saved
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[defaults]\nthreads = 512\n")
    monkeypatch.setenv("KVPOT_HOME", str(home))
    monkeypatch.setattr(checks, "cpu_cores", lambda: 2)
    got = {}

    def session(facts, name, settings, **k):
        got["threads"] = settings.threads
        raise KvpotError("stop here")

    monkeypatch.setattr(cs, "Session", session)
    res = runner.invoke(app, ["ask", str(folder / "doc.txt"), "what?", "-m", str(smollm2_path), "-b", "256", "-P", "h2o"])
    assert got.get("threads") == 2, res.output
    assert "asks for 512 threads; this machine has 2 CPU cores: using 2" in res.output


# -- 18: a stream read stopped early -------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped_stream(smollm2_path, tmp_path_factory) -> Path:
    """A context saved from a read of stdin stopped after its first chunk."""
    folder = tmp_path_factory.mktemp("stream")
    data = logbook()[0][:20000].encode()
    src = SourceSet(sources=[Source(name=STDIN, path=None, size=len(data), head=data, complete=True)])
    with Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check()) as s:
        def stop(p):
            raise ReadingStopped

        with pytest.raises(ReadingStopped):
            s.read(src, stop)
        assert s.read_point is None and s.read_stopped is not None and s.read_stopped.stream
        s.finish_reading()
        s.save(folder / "stdin.kvctx")
    return folder / "stdin.kvctx"


def test_a_stopped_stream_read_is_recorded_and_said_on_reopening(stopped_stream):
    header = read_context(stopped_stream).header
    rs = header["read_stopped"]
    assert rs["stream"] is True and rs["tokens"] == header["tokens_read"] and rs["tokens"] < rs["of_tokens"]
    assert "read_point" not in header
    res = runner.invoke(app, ["ask", "--context", str(stopped_stream), "what?"])
    assert "reopened" in res.output and "error:" not in res.output, res.output
    assert (f"the input was read only partly: {rs['tokens']:,} of ~{rs['of_tokens']:,} tokens" in res.output
            and "a stream (stdin or a pipe), which cannot be read again" in res.output), res.output


def test_continue_on_a_stopped_stream_says_it_cannot_be_read_again(stopped_stream, no_load):
    res = runner.invoke(app, ["ask", "--context", str(stopped_stream), "--continue", "what?"])
    rs = read_context(stopped_stream).header["read_stopped"]
    line = _one_error(res, f"holds a read stopped after {rs['tokens']:,} of ~{rs['of_tokens']:,} tokens")
    assert "cannot be read again: --continue cannot read the rest" in line


def test_a_crafted_read_stopped_is_refused(stopped_stream, tmp_path):
    ctx = read_context(stopped_stream)
    for bad in ({"tokens": -1}, {"stream": 1}, {"tokens": 1}):
        path = _crafted(ctx, tmp_path / "c.kvctx", read_stopped=dict(ctx.header["read_stopped"], **bad))
        with pytest.raises(KvpotError, match="is malformed: read_stopped"):
            read_context(path)


# -- 19: --sources after the input changed ---------------------------------------------------------------

def _mapped(path: Path) -> tuple[SourceMap, str]:
    """The map a read of `path` makes (one token a character, in runs of 1,000)."""
    text = collect_sources([str(path)])
    joined = "".join(text.pieces())
    smap = SourceMap()
    for a in range(0, len(joined), 1000):
        run = joined[a:a + 1000]
        smap.add(a, a, len(run), [0] * len(run), lambda t: b"x", text=run)
    smap.marks = list(text.marks)
    return smap, joined


def test_a_changed_file_is_not_quoted(tmp_path):
    path = tmp_path / "a.txt"
    body = "".join(f"line {i} the lamp is a lantern of brass\n" for i in range(300))
    path.write_text(body)
    smap, joined = _mapped(path)
    at = joined.index("line 150 ")
    passage = Passage(str(path), "line 1", at, at + 40, 0.5)
    got = quote([passage], collect_sources([str(path)]), smap)[0]
    assert "lantern" in got.quote and got.where == "line 151" and got.note == ""
    # the same length, another word: the text read back is not what was read
    path.write_text(body.replace("lantern", "SECRETX"))
    got = quote([passage], collect_sources([str(path)]), smap)[0]
    assert got.quote == "" and got.note == CHANGED and got.where == ""
    shown = format_passages([got.as_dict()])
    assert "SECRETX" not in shown and f"{path} changed since it was read: its passages are not quoted" in shown
    # rewritten at another length: no "line 1" for every passage, no quote
    path.write_text("short\n" * 20)
    got = quote([passage], collect_sources([str(path)]), smap)[0]
    assert got.quote == "" and got.note == CHANGED and got.where == ""
    # a map saved before digests were recorded: quoted as it reads now, said to be unchecked
    path.write_text(body.replace("lantern", "SECRETX"))
    old = SourceMap.from_header({k: v for k, v in smap.to_header().items() if k != "digests"})
    got = quote([passage], collect_sources([str(path)]), old)[0]
    assert "SECRETX" in got.quote and got.note == UNCHECKED
    assert "could not be checked" in format_passages([got.as_dict()])


def test_digests_follow_the_map_when_saved_and_cut(tmp_path):
    smap = SourceMap()
    text = "word " * 400
    smap.add(0, 0, len(text), list(range(len(text))), lambda t: b"x", text=text)
    smap.marks = [Mark(0, "a.txt", "line 1")]
    again = SourceMap.from_header(smap.to_header())
    assert again.digests == smap.digests and len(again.digests) == len(again.pos)
    again.truncate(again.pos[3], again.char[3])
    assert len(again.digests) == 3
    with pytest.raises(KvpotError, match="malformed"):
        SourceMap.from_header(dict(smap.to_header(), digests="ab"))


def test_sources_of_a_reopened_context_after_the_file_changed(tmp_path, smollm2_path):
    doc = tmp_path / "doc.txt"
    text = logbook()[0][:1500]
    doc.write_text(text)
    ctx = tmp_path / "c.kvctx"
    res = runner.invoke(app, ["ask", str(doc), "What is written?", "-m", "smollm2-135m", "-P", "full", "-b", "1024",
                              "-n", "4", "--prompt-format", "completion", "--save-context", str(ctx), "--sources"])
    assert res.exit_code == 0 and "sources:" in res.output and "changed since" not in res.output, res.output
    doc.write_text("X" * len(text))  # the same length, other text
    res = runner.invoke(app, ["ask", "--context", str(ctx), "What is written?", "--sources"])
    assert res.exit_code == 0, res.output
    assert "XXXX" not in res.output and "changed since it was read: its passages are not quoted" in res.output


# -- 21: InfLLM's disk check and store ------------------------------------------------------------------

def test_the_disk_check_shows_small_sizes_and_names_a_read_only_folder(tmp_path, monkeypatch):
    import kvpot.session.checks as checks
    from kvpot.models.gguf_file import ModelFacts

    facts = ModelFacts(path=Path("m.gguf"), arch="qwen2", name="m", n_layer=28, n_head=12, n_head_kv=2,
                       n_embd=1536, n_ctx_train=32768, chat_template=None, head_dim_k=128, head_dim_v=128)
    policy = make_policy(f"infllm:store={tmp_path / 'store.kvblk'},store_type=f16")
    policy.fit(2048, 512)
    with pytest.raises(KvpotError) as e:
        checks.check_disk(facts, policy, 20_000, free_bytes=4096)
    assert "MiB to" in str(e.value) and "has 4.0 KiB free" in str(e.value) and "0.0 GiB" not in str(e.value)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda p: usage(10**12, 10**12, 0))
    monkeypatch.setattr(checks.os, "access", lambda p, mode: False)
    with pytest.raises(KvpotError) as e:
        checks.check_disk(facts, policy, 20_000)
    assert f"but {tmp_path} is not writable" in str(e.value) and "free" not in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_store_that_became_a_fifo_or_link_says_what_it_is(tmp_path, kind):
    store = tmp_path / "store.kvblk"
    if kind == "fifo":
        os.mkfifo(store)
        want = "is a named pipe (FIFO) now, not a block store"
    else:
        (tmp_path / "other").write_bytes(b"x")
        store.symlink_to(tmp_path / "other")
        want = f"is a symbolic link to {tmp_path / 'other'} now, not a block store"
    policy = make_policy(f"infllm:store={store}")
    with pytest.raises(KvpotError, match="not a block store") as e:
        policy.fit(2048, 512)
    assert want in str(e.value) and "a saved context's store is the regular file kvpot wrote" in str(e.value)
    assert stat.S_ISFIFO(os.lstat(store).st_mode) or store.is_symlink()  # left as it was
