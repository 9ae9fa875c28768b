"""The runtime never takes llama.cpp's AMX path (issue 20824), and this holds on any x86 machine.

Three levels, each able to fail without the fix:
- the built library: the CPU device offers no AMX weight buffer type, its features list no AMX, and
  a model's weights are loaded and run through the matmuls that crashed on AMX hosts;
- the build recipe: ggml configured for an AMX CPU (explicit GGML_AMX_* or -march=native on a
  Sapphire Rapids host, simulated with -march=sapphirerapids) compiles amx.cpp without __AMX_INT8__,
  while the opt-in KVPOT_CPU_AMX=ON does define it (so the check has teeth);
- the wheel cache key and the crash reports that go with them.
"""

from __future__ import annotations

import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from kvpot import paths
from kvpot.build import native
from kvpot.build.cache_key import cache_key
from kvpot.build.pins import VENDOR_DIR
from kvpot.build.sdist import extract_pristine, fetch_sdist
from kvpot.runtime import cpu, library

X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


# --- the built library --------------------------------------------------------------------------

def test_cpu_device_offers_no_amx_buffer_type():
    lib = library.load()
    bufts = [b for b in lib.kvpot_cpu_extra_bufts().decode().split(",") if b]
    features = cpu.parse_features(lib.kvpot_cpu_features().decode())
    assert "AMX" not in bufts, bufts
    assert features.get("AMX_INT8") != "1", features
    # the rest of ggml's CPU backend is intact: weight repacking (ARM phones rely on it) stays
    assert features.get("REPACK") == "1", features
    assert "CPU_REPACK" in bufts, bufts


_RUN_WORKLOAD = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=2048, n_batch=512, n_ubatch=512, verbose=True)
toks = llm.tokenize(("The keeper of the lighthouse wrote the tides down each night. " * 120).encode())[:1024]
llm.eval(toks)
print("evaluated", len(toks))
"""


@pytest.mark.slow
def test_weights_never_land_in_amx_and_the_crashing_workload_runs(gemma_path, tmp_path):
    """The report's reproduction (Gemma-3-270M Q4_K_M, 512-token batches through plain llama_cpp)
    in a child process: on an AMX host the unpatched build dies with SIGSEGV here. The loader's
    log names every buffer the weights went to; AMX must not be one of them."""
    script = tmp_path / "workload.py"
    script.write_text(_RUN_WORKLOAD)
    res = subprocess.run([sys.executable, str(script), str(gemma_path)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "evaluated 1024" in res.stdout
    buffers = set(re.findall(r"load_tensors:\s+(\S+) model buffer size", res.stderr))
    assert buffers, res.stderr[-3000:]  # the log format is what this check reads; it must be there
    assert not any("AMX" in b for b in buffers), buffers


# --- the build recipe ---------------------------------------------------------------------------

def _ggml_tree(tmp_path: Path) -> Path:
    """The pinned ggml with kvpot's patches to it applied and ggml_ext/ beside it, as the build stages it."""
    vendor = extract_pristine(fetch_sdist(paths.build_dir() / "sdist"), paths.build_dir()) / VENDOR_DIR
    tree = tmp_path / "llama.cpp"
    shutil.copytree(vendor / "ggml", tree / "ggml", ignore=shutil.ignore_patterns("*.md"))
    shutil.copytree(REPO / "ggml_ext", tree / "ggml_ext")
    # the sdist leaves out ggml's pkg-config template, which a standalone configure writes out
    (tree / "ggml" / "ggml.pc.in").touch()
    from kvpot.build.patching import read_series

    for patch in read_series(REPO / "patches"):
        if re.search(r"^\+\+\+ b/ggml/", patch.read_text(), flags=re.M):
            subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-s", "-d", str(tree), "-i", str(patch)], check=True)
    return tree


def _amx_macros(tree: Path, build: Path, cmake_args: list[str], march: str | None = None) -> set[str]:
    """Configure ggml, then preprocess ggml-cpu/amx/amx.cpp with its exact compile command."""
    subprocess.run(["cmake", "-S", str(tree / "ggml"), "-B", str(build), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                    "-DGGML_OPENMP=OFF", "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", *cmake_args],
                   check=True, capture_output=True, text=True)
    entries = json.loads((build / "compile_commands.json").read_text())
    entry = next(e for e in entries if e["file"].endswith("ggml-cpu/amx/amx.cpp"))
    args = shlex.split(entry["command"])
    if march is not None:
        assert "-march=native" in args, args
        args = [march if a == "-march=native" else a for a in args]
    # drop "-o OBJ", "-c", dependency outputs; preprocess and dump the macros instead
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-c", "-MD"):
            continue
        out.append(a)
    res = subprocess.run([*out, "-dM", "-E", entry["file"]], cwd=entry["directory"], check=True,
                         capture_output=True, text=True)
    return {ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("#define __AMX") or
            ln.startswith("#define __AVX512VNNI__")}


_AMX_BY_HAND = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON",
                "-DGGML_AMX_BF16=ON"]


@pytest.mark.skipif(not X86, reason="AMX exists only on x86; other CPUs never compile ggml's AMX path")
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake builds the runtime; without it nothing is built")
def test_ggml_for_an_amx_cpu_compiles_without_amx(tmp_path):
    tree = _ggml_tree(tmp_path)
    # what a user gets: -march=native on a Sapphire Rapids host, and GGML_AMX_* asked for by hand
    native_amx = _amx_macros(tree, tmp_path / "native", ["-DGGML_NATIVE=ON"], march="-march=sapphirerapids")
    by_hand = _amx_macros(tree, tmp_path / "by-hand", _AMX_BY_HAND)
    # the opt-in keeps upstream's behaviour, which shows the check above can see AMX when it is there
    opted_in = _amx_macros(tree, tmp_path / "opt-in", [*_AMX_BY_HAND, "-DKVPOT_CPU_AMX=ON"])
    assert "__AMX_INT8__" in opted_in, opted_in
    for got in (native_amx, by_hand):
        assert "__AVX512VNNI__" in got, got  # the target really was an AMX-class CPU
        assert not any(m.startswith("__AMX") for m in got), got


# --- the wheel cache key ------------------------------------------------------------------------

def _fake_compiler(tmp_path: Path, name: str, defines: list[str]) -> str:
    """A 'compiler' that answers -dM -E with the given macros, as gcc/clang would for -march=native."""
    script = tmp_path / name
    body = "\\n".join(f"#define {d} 1" for d in defines)
    script.write_text(f"#!/bin/sh\nprintf '{body}\\n'\n")
    script.chmod(0o755)
    return str(script)


def test_native_target_separates_cpus_in_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, "cc-avx2", ["__x86_64__", "__AVX2__", "__FMA__"]))
    avx2 = native.native_target("-DLLAVA_BUILD=OFF")
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, "cc-amx", ["__x86_64__", "__AVX2__", "__FMA__",
                                                                   "__AVX512F__", "__AMX_INT8__"]))
    amx = native.native_target("-DLLAVA_BUILD=OFF")
    assert avx2.native and amx.native
    assert avx2.features == ("__AVX2__", "__FMA__")
    assert "__AMX_INT8__" in amx.features and "__x86_64__" not in amx.features
    assert avx2.fingerprint != amx.fingerprint
    keys = {cache_key(REPO / "patches", REPO / "ggml_ext", "-DLLAVA_BUILD=OFF", t.fingerprint) for t in (avx2, amx)}
    assert len(keys) == 2
    # a portable build does not depend on the host
    assert native.native_target("-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF").fingerprint == "portable"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # ggml turns GGML_NATIVE off by default then
    assert not native.native_target("-DLLAVA_BUILD=OFF").native
    assert native.native_target("-DGGML_NATIVE=ON").native


def test_this_machine_native_target_matches_the_compiler():
    """The real compiler here: the fingerprint is stable and the features are what it predefines."""
    first, second = native.native_target(""), native.native_target("")
    assert first == second
    if first.native:
        res = subprocess.run([*shlex.split(first.compiler), first.flag, "-dM", "-E", "-x", "c", "/dev/null"],
                             capture_output=True, text=True, check=True)
        for feat in first.features:
            assert f"#define {feat} " in res.stdout


# --- CPU report (doctor) ------------------------------------------------------------------------

def test_cpu_report_flags_a_wheel_built_for_another_cpu():
    features = {"SSE3": "1", "AVX2": "1", "AVX512": "1", "REPACK": "1"}
    older_host = frozenset({"sse2", "pni", "avx2", "fma"})
    rep = cpu.compare(features, ["CPU_REPACK"], older_host)
    assert rep.missing_here == ("AVX512",)
    newer_host = frozenset({"sse2", "pni", "avx2", "avx512f", "avx512_vnni", "amx_int8"})
    rep = cpu.compare(features, ["CPU_REPACK"], newer_host)
    assert rep.missing_here == ()
    assert rep.unused_here == ("AVX512_VNNI",)  # AMX is off on purpose, not a missed feature
    assert not rep.amx_built and not rep.amx_buffer
    assert cpu.compare({"AMX_INT8": "1"}, ["AMX", "CPU_REPACK"], newer_host).amx_buffer


def test_host_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu.host_flags(info) == frozenset({"fpu", "sse2", "avx2", "amx_int8"})
    assert cpu.host_flags(tmp_path / "missing") is None


def test_doctor_says_amx_is_off_and_why():
    from conftest import run_cli

    res = run_cli("doctor", env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert re.search(r"AMX\s+│\s+off: kvpot builds ggml's CPU backend without", res.stdout), res.stdout
    lib = library.load()
    built = [n for n, v in cpu.parse_features(lib.kvpot_cpu_features().decode()).items() if v == "1"]
    row = next(ln for ln in res.stdout.splitlines() if "CPU built for" in ln)
    for name in built:
        if name in cpu._HOST_FLAG:
            assert name in row.split(), (name, row)


# --- crash reports ------------------------------------------------------------------------------

_CRASH = """
import ctypes, os, sys
from kvpot.cli._crash import enable_crash_reports
enable_crash_reports()
from kvpot.runtime import library
library.load()
def read_the_document():
    if sys.argv[1] == "segv":
        ctypes.string_at(0)
    os.abort()  # what a GGML_ASSERT ends in
read_the_document()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals; Windows has faulthandler alone")
@pytest.mark.parametrize("how", ["segv", "abort"])
def test_native_crash_names_version_runtime_and_step(tmp_path, how):
    import llama_cpp

    import kvpot

    script = tmp_path / "crash.py"
    script.write_text(_CRASH)
    res = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert f"kvpot {kvpot.__version__} crashed in native code" in res.stderr, res.stderr
    assert llama_cpp.__version__ in res.stderr
    assert "Fatal Python error" in res.stderr
    assert "read_the_document" in res.stderr  # the step that died
    # the banner comes first, then faulthandler's report
    assert res.stderr.index("crashed in native code") < res.stderr.index("Fatal Python error")
