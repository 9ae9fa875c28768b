"""Reopening a saved context restores llama.cpp's sequence state straight from the file
(kvpot_state_seq_read_fd): the state, as large as the cache it fills, is never held in memory beside it.
The restored cache is byte for byte the one saved, chat's /reset restores it again from the file after
checking the file is still the one opened, and a process reopening a large context does not grow by a
copy of the state beside the cache."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from kvpot.bench.logbook import logbook
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.context_file import read_context
from kvpot.session.session import Session
from kvpot.session.settings import RunSettings
from kvpot.state.engine_state import SeqInFile

SMALL = RunSettings(budget=512, chunk=128, threads=2, prompt="completion", max_tokens=8, policy="infinipot")


@pytest.fixture(scope="module")
def saved(smollm2_path, tmp_path_factory):
    text, question, _ = logbook(n_entries=40)
    doc = tmp_path_factory.mktemp("stream") / "log.txt"
    doc.write_text(text)
    s = Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check())
    s.read(collect_sources([str(doc)]))
    assert s.engine.n_compactions > 0
    path = doc.with_suffix(".kvctx")
    s.save(path)
    want = bytes(s.engine.ctx.seq_state())
    s.engine.close()
    return path, want, question


def _reopen(path, smollm2_path) -> Session:
    return Session.reopen(path, read_model_facts(smollm2_path), "smollm2-135m")


@pytest.mark.skipif(not hasattr(os, "pread"), reason="restoring from a file needs pread (POSIX)")
def test_the_state_is_restored_from_the_file_byte_for_byte(saved, smollm2_path):
    path, want, question = saved
    assert read_context(path).state.seq == want  # the file holds what the session had
    r = _reopen(path, smollm2_path)
    try:
        assert isinstance(r._after_reading.seq, SeqInFile)  # kept for /reset as a place in the file, not bytes
        assert bytes(r.engine.ctx.seq_state()) == want
        "".join(r.ask(question))
        r.reset_conversation()  # the second restore, again from the file
        assert bytes(r.engine.ctx.seq_state()) == want
    finally:
        r.engine.close()


@pytest.mark.skipif(not hasattr(os, "pread"), reason="restoring from a file needs pread (POSIX)")
def test_reset_refuses_a_file_changed_since_it_was_opened(saved, smollm2_path, tmp_path):
    path, _, question = saved
    copy = tmp_path / "c.kvctx"
    copy.write_bytes(path.read_bytes())
    r = _reopen(copy, smollm2_path)
    try:
        "".join(r.ask(question))
        with copy.open("r+b") as f:  # changed in place: the reopened file is this one
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(KvpotError, match="corrupted|changed since it was opened"):
            r.reset_conversation()
    finally:
        r.engine.close()


REOPEN = r"""
import json, sys
from kvpot.models.gguf_file import read_model_facts
from kvpot.runtime.llama import LlamaModel
from kvpot.session import context_file, session

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

if sys.argv[3] == "bytes":  # the reference: the state read into memory whole, then restored from there
    whole = context_file.read_context
    session.read_context = lambda path, seq_in_file=False: whole(path)
LlamaModel(sys.argv[1]).close()  # the weights' pages once, so that the reopen below adds only its own
state = len(context_file.read_context(sys.argv[2], seq_in_file=True).state.seq)
before = status("VmHWM")
r = session.Session.reopen(sys.argv[2], read_model_facts(sys.argv[1]), "smollm2-135m", resettable=False)
print(json.dumps({"grew": status("VmHWM") - before, "state": state}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RSS from /proc")
def test_reopening_does_not_hold_the_state_beside_the_cache(smollm2_path, tmp_path):
    """A SmolLM2 context of ~3,500 cells (~78 MiB of sequence state), reopened in a fresh process: its peak
    grows by at least half the state less than when the state is read into memory whole first (the same
    reopen with read_context's in-memory state, measured in the same run)."""
    text, _, _ = logbook(n_entries=80)
    doc = tmp_path / "log.txt"
    doc.write_text(text)
    settings = dataclasses.replace(SMALL, policy="full", budget=4096, chunk=512)
    s = Session(read_model_facts(smollm2_path), "smollm2-135m", settings.check(), resettable=False)
    s.read(collect_sources([str(doc)]))
    assert s.doc_tokens > 3000
    s.save(tmp_path / "big.kvctx")
    s.engine.close()
    got = {}
    for mode in ("file", "bytes"):
        out = subprocess.run([sys.executable, "-c", REOPEN, str(smollm2_path), str(tmp_path / "big.kvctx"), mode],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    state = got["file"]["state"]
    assert state > 64 << 20, got
    assert got["file"]["grew"] + state // 2 < got["bytes"]["grew"], got
