"""Unpatched llama.cpp of the runtime's commit (kvpot.build.upstream, kvpot.bench.stock_upstream), the
reference of every speed and memory ratio: it is really upstream's library at its defaults, loaded alone
in its own process, and it reads a document as kvpot's runtime with no pot does (the same greedy next
token, computed here with kvpot's runtime in the same test).

The build takes minutes on 2 cores: `make pull-test-models` (which `make test` runs first) makes it
through `make stock-upstream`; here it is found in the cache, or built where it is not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvpot.build import upstream
from kvpot.errors import BuildError

# a short input whose next token is far from a tie: greedy picks it on both libraries whatever the
# attention kernel (upstream's flash attention auto against kvpot's stock context without it)
TEXT = ("The lighthouse keeper counted the ships that passed: one, two, three, four, five, six, seven, eight, "
        "nine, ten, eleven, twelve, thirteen, fourteen, fifteen,")


def _have_compiler() -> bool:
    return any(shutil.which(c) for c in ("cc", "gcc", "clang")) and any(shutil.which(c) for c in ("c++", "g++", "clang++"))


@pytest.fixture(scope="module")
def build():
    if not _have_compiler():
        pytest.skip("no C/C++ compiler on PATH: unpatched llama.cpp cannot be built here")
    return upstream.build_upstream()


def test_the_unpatched_library_reads_as_kvpots_runtime_with_no_pot(build, smol, smollm2_path):
    import numpy as np

    from kvpot.bench.stock import prefill, stock_context
    from kvpot.bench.stock_upstream import measure

    tokens = smol.bos() + smol.tokenize(TEXT)
    ctx = stock_context(smol, len(tokens) + 16, 64, 2)
    prefill(ctx, tokens, 64)
    logits = ctx.logits_last()
    want = int(np.argmax(logits))
    ctx.close()
    got = measure(build, str(smollm2_path), tokens=tokens, n_ctx=len(tokens) + 16, chunk=64, threads=2)
    assert got["next_token"] == want, (smol.piece(got["next_token"]), smol.piece(want))
    assert got["tokens"] == len(tokens) and got["tok_s"] > 0 and got["peak_rss_mb"] > 0


def test_it_is_upstreams_library_at_its_defaults_alone_in_its_process(build, smol, smollm2_path):
    from kvpot.bench.stock_upstream import bindings_root, measure
    from kvpot.runtime.library import load

    got = measure(build, str(smollm2_path), tokens=smol.bos() + smol.tokenize(TEXT), n_ctx=256, chunk=64, threads=2)
    lib_dir = Path(build.lib_dir).resolve()
    mapped = [Path(p) for p in got["libraries"]]
    assert any(p.name.startswith("libllama") for p in mapped) and any(p.name.startswith("libggml") for p in mapped)
    assert all(p.is_relative_to(lib_dir) for p in mapped), mapped
    patched = Path(load()._name).resolve().parent
    assert not any(p.is_relative_to(patched) for p in mapped)
    # llama-cpp-python's bindings of the pristine sdist, not the installed kvpot wheel's
    assert Path(got["bindings"]).is_relative_to(bindings_root().resolve())
    # llama.h's defaults, flash attention among them (auto), which llama.cpp turned on for this CPU
    assert got["defaults"]["flash_attn_type"] == "auto" and got["params"]["flash_attn_type"] == "auto"
    assert got["flash_attn_enabled"] and any("load_mode = mmap" in ln for ln in got["log"]), got["log"]
    assert got["params"]["n_threads"] == 2 and got["params"]["n_batch"] == 64
    # the build's identity, as a benchmark JSON records it
    assert got["build"]["sdist_sha256"] == upstream.SDIST_SHA256 and got["build"]["lib_dir"] == build.lib_dir
    # upstream's source as the sdist holds it: no kvpot API in the library, no ggml_ext/ in the tree it was built from
    assert b"kvpot_abi_version" not in (lib_dir / "libllama.so").read_bytes()
    assert b"kvpot_abi_version" in Path(load()._name).read_bytes()
    assert not (bindings_root() / "vendor" / "llama.cpp" / "ggml_ext").exists()

def test_the_build_is_keyed_by_the_cpu_flags_and_found_again(build, monkeypatch):
    key, args, _ = upstream.plan()
    assert build.key == key and Path(build.lib_dir).is_relative_to(upstream.build_folder(key))
    assert upstream.find_cached() == build  # a second call builds nothing
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    other, other_args, target = upstream.plan()
    assert other != key and "-DGGML_NATIVE=OFF" in other_args and not target.native


def test_no_compiler_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(BuildError) as e:
        upstream._check_tools()
    msg = str(e.value)
    assert "\n" not in msg and "cmake" in msg and "C compiler" in msg
