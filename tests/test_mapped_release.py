"""Weights llama.cpp copies out of its file mapping (repacked for this CPU) leave their source pages
resident; kvpot gives them back after loading (ggml_ext/kvpot-mapped.cpp). Checked in a fresh
process, whose RSS is its own: the bytes given back are those of the tensors llama.cpp's log says it
repacked (sizes read from the GGUF by the `gguf` package, not by kvpot), RSS falls by that much, and
the logits of the same prompt are bit-identical before and after (so no page a weight is read from
was given back). On a CPU without repacked layouts llama.cpp copies nothing: the figure must be 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys
import numpy as np
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

m = LlamaModel(sys.argv[1], release_copied=False, release_while_loading=False)
ctx = LlamaContext(m, ContextParams(n_ctx=256, n_batch=64, n_threads=2))
toks = m.tokenize("The licence says the program comes with no warranty, and", add_bos=True)
ctx.decode(toks, 0)
before = ctx.logits_last().copy()
r0 = rss()
released = m.release_copied()
r1 = rss()
ctx.clear()
ctx.decode(toks, 0)
after = ctx.logits_last().copy()
print(json.dumps({"released": released, "rss_drop": r0 - r1, "same": bool(np.array_equal(before, after)),
                  "page": os.sysconf("SC_PAGE_SIZE")}))
"""


def _repacked(log: str) -> list[str]:
    """Tensor names llama.cpp's loader says it repacked ("repack: repack tensor NAME with TYPE"; the
    loader's progress dots may precede it on the line)."""
    mark = "repack: repack tensor "
    return [line.split(mark, 1)[1].split()[0] for line in log.splitlines() if mark in line]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RSS from /proc")
def test_copied_weights_pages_given_back(gemma_path, tmp_path):
    gguf = pytest.importorskip("gguf")
    log = tmp_path / "llama.log"
    env = dict(os.environ, KVPOT_LLAMA_LOG=str(log))
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(gemma_path)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"], "logits changed after the copied weights' pages were given back"

    names = set(_repacked(log.read_text(errors="replace")))
    tensors = sorted(gguf.GGUFReader(str(gemma_path)).tensors, key=lambda t: int(t.data_offset))
    assert names <= {t.name for t in tensors}, names - {t.name for t in tensors}
    if not names:  # nothing copied on this CPU (no repacked layout for these types): nothing to give back
        assert got["released"] == 0
        return
    # the pages wholly inside each run of repacked tensors that follow one another in the file, within the
    # span of the tensors read in place (llama.cpp unmaps the mapping outside it: nothing left to give back)
    kept = [t for t in tensors if t.name not in names]
    lo, hi = int(kept[0].data_offset), max(int(t.data_offset) + int(t.n_bytes) for t in kept)
    page, expected, run = got["page"], 0, None
    for t in tensors + [None]:
        if t is not None and t.name in names:
            beg, end = int(t.data_offset), int(t.data_offset) + int(t.n_bytes)
            run = (run[0], end) if run else (beg, end)
            continue
        if run:
            beg, end = max(run[0], lo), min(run[1], hi)
            expected += max(0, (end // page) * page - -(-beg // page) * page)
            run = None
    assert got["released"] == expected, (got, expected)
    # MAP_POPULATE made every page resident, so RSS falls by what was given back (a page kept by another
    # part of the process, e.g. an earlier read of the same file, may stay: 10 % leeway)
    assert got["rss_drop"] >= 0.9 * got["released"], got


LOAD_SCRIPT = r"""
import json, sys
import numpy as np
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

m = LlamaModel(sys.argv[1], release_copied=False, release_while_loading=sys.argv[2] == "on")
peak = status("VmHWM")        # the process's peak so far: loading, before any context exists
copied = m.release_copied()   # the copied weights' source pages (the test above checks this figure)
ctx = LlamaContext(m, ContextParams(n_ctx=256, n_batch=64, n_threads=2))
ctx.decode(m.tokenize("The licence says the program comes with no warranty, and", add_bos=True), 0)
np.save(sys.argv[3], ctx.logits_last())
print(json.dumps({"peak": peak, "copied": copied}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RSS from /proc")
def test_loading_does_not_peak_at_the_file_plus_its_copies(qwen05_path, tmp_path):
    """With the loader's progress callback giving the file's pages back as weights are copied out, the
    load's peak RSS is lower than without by about the copied bytes (each copy no longer sits beside its
    source), and the logits are bit-identical (the pages of weights read in place fault back in). The
    0.5B Qwen model: Q4_K weights, ~80 MiB of them repacked on AVX2/AVX-512/NEON."""
    import numpy as np

    got = {}
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(qwen05_path), mode, str(tmp_path / f"{mode}.npy")],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert np.array_equal(np.load(tmp_path / "off.npy"), np.load(tmp_path / "on.npy")), "logits changed"
    copied = got["off"]["copied"]
    # nothing copied on a CPU without repacked layouts: loading peaks at the file either way
    assert got["off"]["peak"] - got["on"]["peak"] >= 0.8 * copied, got
    if copied == 0:
        assert got["on"]["peak"] <= 1.02 * got["off"]["peak"], got
