"""Hostile inputs around InfLLM's block store and KVPOT_HOME: a store path never replaces a file or makes a
folder, reopening an older saved context never harms a later one sharing its store, SIGTERM/SIGHUP leave
no store and a killed process's store is reclaimed (one a saved context references never), and a
KVPOT_HOME that is not a folder is one line before any work."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import struct
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import InfLLM
from kvpot.runtime.blocks import BlockStore, BlockStoreError

SHAPE = dict(n_layer=2, n_head_kv=1, d_k=4, d_v=4, block_size=2)
# blocks of 8 in a pot of 128 cells: a few hundred tokens fill a store
INFLLM = "infllm:block_size=8"
SMALL = ["--budget", "128", "--chunk", "16", "-n", "1", "--prompt-format", "completion"]


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def small_store(path, n_blocks: int = 1) -> None:
    with BlockStore(path, **SHAPE, create=True) as s:
        for _ in range(n_blocks):
            s.append(np.arange(2), np.zeros((2, 1, 4)), np.zeros((2, 1, 2, 4)), np.zeros((2, 1, 2, 4)))


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("doc") / "doc.txt"
    path.write_text(logbook(n_entries=5, seed=3)[0])
    return path


# -- store paths -------------------------------------------------------------------------------------

def test_a_new_store_never_replaces_a_file(tmp_path):
    """The C open for a new store refuses every existing path (O_EXCL): a file, a symlink to one, a
    dangling symlink (which would create its target)."""
    victim = tmp_path / "notes.txt"
    victim.write_text("precious\n")
    link = tmp_path / "link.kvblk"
    link.symlink_to(victim)
    dangling = tmp_path / "dangling.kvblk"
    dangling.symlink_to(tmp_path / "made-through-the-link")
    for path in (victim, link, dangling):
        with pytest.raises(BlockStoreError, match="already exists") as err:
            BlockStore(path, **SHAPE, create=True)
        assert "\n" not in str(err.value)
    assert victim.read_text() == "precious\n" and not (tmp_path / "made-through-the-link").exists()


def test_a_store_whose_block_size_overflows_is_refused(tmp_path):
    """Layers x record bytes = 2^80 + 2^64 (0 in 64 bits): a division by zero in an unchecked reader."""
    path = tmp_path / "wrap.kvblk"
    path.write_bytes(b"KVPOTBLK" + struct.pack("<7I", 1, 64, 1 << 20, 1 << 20, (1 << 19) - 1, 8, 1 << 20) + bytes(28))
    with pytest.raises(BlockStoreError, match="header is corrupt"):
        BlockStore(path)


@pytest.mark.parametrize("case", ["text file", "the input", "another store", "a folder", "missing folder"])
def test_store_path_that_is_not_new_is_refused_before_reading(smollm2_path, doc, tmp_path, case):
    work = tmp_path / "work"
    work.mkdir()
    text = work / "doc.txt"
    text.write_bytes(doc.read_bytes())
    target = {"text file": work / "notes.txt", "the input": text, "another store": work / "other.kvblk",
              "a folder": work, "missing folder": tmp_path / "nonexistent" / "dir" / "x.kvblk"}[case]
    if case == "text file":
        target.write_text("precious\n")
    elif case == "another store":
        small_store(target, 3)
    before = {p: sha256(p) for p in work.iterdir()}
    res = run_cli("ask", str(text), "what?", "-m", str(smollm2_path), "-P", f"{INFLLM},store={target}", *SMALL,
                  env={"KVPOT_HOME": str(tmp_path / "home")})
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and f"store={target}" in line, res.stderr
    if case != "another store":  # a block store may be a saved context's: that is known at the first chunk
        assert_one_line_error(res.stderr, f"store={target}")
    assert {p: sha256(p) for p in work.iterdir()} == before
    assert not (tmp_path / "nonexistent").exists()


def test_a_store_made_for_an_earlier_document_is_replaced_unless_a_context_references_it(tmp_path):
    """The same policy reading a second document (a bench's runs): its own store=PATH file is new to it;
    once a saved context references it, it is refused instead."""
    path = tmp_path / "mine.kvblk"
    p = InfLLM(store=str(path))
    p.fit(256, 64)
    p._check_store_target()
    p._store_for_append(2, 1, 4, 4)  # what the first eviction does
    p.reset()
    p.fit(256, 64)
    p._check_store_target()  # made here, referenced by nothing: fine
    p._store_for_append(2, 1, 4, 4)
    p.keep_on_disk()
    p.reset()
    with pytest.raises(KvpotError, match="exists"):
        p._check_store_target()
    assert path.exists()


# -- reopening a saved context -----------------------------------------------------------------------

def test_reopening_an_older_context_keeps_a_later_one_sharing_its_store(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared.kvblk"
    config = EngineConfig(budget=128, chunk=16, n_threads=2)
    eng = Engine(str(smollm2_path), InfLLM(store=str(shared), block_size=8), config)
    toks = eng.model.tokenize(logbook(n_entries=10, seed=3)[0])
    eng.feed(toks[:150])
    a = eng.export_state()
    eng.policy.keep_on_disk()  # what Session.save does once the context file is written
    n_a = eng.policy._store_blocks
    eng.feed(toks[150:220])
    b = eng.export_state()
    eng.policy.keep_on_disk()
    n_b = eng.policy._store_blocks
    want_b = eng.next_logits(" The code is")
    eng.close()
    assert 0 < n_a < n_b
    shared_sha = sha256(shared)

    other = Engine(str(smollm2_path), InfLLM(store=str(tmp_path / "unused.kvblk"), block_size=8), config)
    other.import_state(a)  # the older context, from the shared store
    assert other.policy._blocks.n_blocks == n_a  # it sees only its own blocks
    other.feed(toks[220:300])  # and reads on: its new blocks go to a copy, never into the shared file
    assert other.policy._store_blocks > n_a and other.policy._store_path != str(shared)
    assert sha256(shared) == shared_sha
    other.import_state(b)  # the later context still loads (its digest is checked) and answers the same
    assert other.policy._blocks.n_blocks == n_b
    np.testing.assert_array_equal(other.next_logits(" The code is"), want_b)
    other.close()
    assert sha256(shared) == shared_sha


# -- signals and stale stores ------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_reading_leaves_no_store(smollm2_path, tmp_path, signum):
    home = tmp_path / "home"
    doc = tmp_path / "long.txt"
    doc.write_text(logbook(n_entries=600, seed=5)[0])  # minutes of reading: the signal comes first
    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", "ask", str(doc), "what?",
           "-m", str(smollm2_path), "-P", INFLLM, *SMALL]
    proc = subprocess.Popen(cmd, env={**os.environ, "KVPOT_HOME": str(home)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not list(home.glob("blocks/*.kvblk")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1]
        assert list(home.glob("blocks/*.kvblk")), "no store appeared"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and f"stopped by {signal.Signals(signum).name}" in stderr
    assert list(home.glob("blocks/*")) == []


def test_a_killed_process_store_is_reclaimed_and_a_kept_one_never(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    dead = dead_pid()
    stale = blocks / f"{uuid.uuid4().hex}.{dead}.kvblk"
    kept = blocks / f"{uuid.uuid4().hex}.{dead}.kvblk"
    live = blocks / f"{uuid.uuid4().hex}.{os.getppid()}.kvblk"
    users = blocks / f"{dead}.kvblk"  # not kvpot's name
    for p in (stale, kept, live, users):
        small_store(p)
    kept.chmod(0o444)  # what keep_on_disk does when a saved context references it
    InfLLM().fit(256, 64)  # a new run with the default store
    assert sorted(blocks.iterdir()) == sorted([kept, live, users])


def test_a_store_a_saved_context_references_outlives_its_process(smollm2_path, doc, tmp_path):
    """`ask --save-context` ends (its pid is dead): a later run reclaims nothing it references, and the
    context reopens."""
    env = {"KVPOT_HOME": str(tmp_path / "home")}
    ctx = tmp_path / "c.kvctx"
    res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), "-P", INFLLM, *SMALL, "--save-context",
                  str(ctx), env=env)
    assert res.returncode in (0, 5), res.stderr
    [store] = list((tmp_path / "home" / "blocks").glob("*.kvblk"))
    assert not stat.S_IMODE(store.stat().st_mode) & 0o222  # read-only: referenced
    res = run_cli("ask", "--context", str(ctx), "what else?", "-m", str(smollm2_path), "-n", "1", env=env)
    assert res.returncode in (0, 5), res.stderr
    assert list((tmp_path / "home" / "blocks").glob("*.kvblk")) == [store]


# -- KVPOT_HOME --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "below"), [(["pull", "smollm2-135m"], False), (["ask", "DOC", "what?"], False),
                                             (["ask", "DOC", "what?", "-m", "MODEL", "-P", "infllm"], False),
                                             (["pull", "smollm2-135m"], True)])  # below: KVPOT_HOME=FILE/sub
def test_kvpot_home_that_is_a_file_is_one_line(smollm2_path, doc, tmp_path, args, below):
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    home = afile / "sub" if below else afile
    args = [str(doc) if a == "DOC" else str(smollm2_path) if a == "MODEL" else a for a in args]
    res = run_cli(*args, env={"KVPOT_HOME": str(home)})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, f"KVPOT_HOME {home} is not a folder")
    assert afile.read_text() == "not a folder\n"


def test_blocks_folder_that_is_a_file_is_one_line_before_reading(smollm2_path, doc, tmp_path):
    (tmp_path / "blocks").write_text("not a folder\n")
    res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), "-P", INFLLM, *SMALL,
                  env={"KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, f"{tmp_path / 'blocks'} is not a folder")
