"""ggml's backend libraries export ggml's C API and nothing else (ggml_ext/ggml_backend_exports.cmake).

A CUDA 13 build of libggml-cuda.so exported copies of libstdc++'s own symbols, and libllama's stream
output bound to them: every model load segfaulted in llama_model::print_info (docs/pot.md, "The Python
product on CUDA"). With only ggml_* exported no backend can stand in for the C++ runtime, whatever its
toolchain links in. Two levels, each able to fail without the fix:
- the built runtime here: every backend library's dynamic symbols are ggml_* (before the fix
  libggml-cpu.so exported std::vector members, quantize_row_* and llamafile_sgemm), and libllama,
  libggml and the other backends need nothing else from them (or they would not load);
- the build recipe, for backends this machine does not build: configured with CUDA's and the
  loadable CPU variants' layout (GGML_BACKEND_DL), every backend library is linked with the script.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpot.runtime import library

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="version scripts are for ELF linkers; "
                                "macOS and Windows look a symbol up in the library linked against it")


def _dynamic_symbols(lib: Path, defined: bool) -> set[str]:
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(lib)], check=True, capture_output=True, text=True).stdout
    return {ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.strip()}


def _runtime_libraries() -> dict[str, Path]:
    """name -> file of every shared library beside the libllama kvpot loaded (real files, not links)."""
    libdir = Path(library.info().library_path).resolve().parent
    found = {}
    for f in sorted(libdir.glob("lib*.so*")):
        if f.is_file() and not f.is_symlink():
            found[f.name.split(".so")[0]] = f
    return found


def _backends(libs: dict[str, Path]) -> dict[str, Path]:
    return {n: f for n, f in libs.items() if n.startswith("libggml-") and n != "libggml-base"}


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) comes with the compiler the runtime was "
                    "built with")
def test_backend_libraries_export_only_ggml_symbols():
    backends = _backends(_runtime_libraries())
    assert "libggml-cpu" in backends, sorted(backends)  # the CPU backend is always built: never vacuous
    for name, f in backends.items():
        exported = _dynamic_symbols(f, defined=True)
        assert exported, name
        foreign = sorted(s for s in exported if not s.startswith("ggml_"))
        assert not foreign, f"{name} exports {len(foreign)} symbols beside ggml_*: {foreign[:8]}"


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) comes with the compiler the runtime was "
                    "built with")
def test_nothing_needs_a_backend_symbol_beside_ggml():
    # what the others import from a backend, they find among its ggml_* exports: the script hides
    # nothing anyone links against (a hidden one would fail at load, which the other tests would show)
    libs = _runtime_libraries()
    backends = _backends(libs)
    for name, f in backends.items():
        exported = _dynamic_symbols(f, defined=True)
        for other, g in libs.items():
            if other == name:
                continue
            taken = _dynamic_symbols(g, defined=False) & exported
            assert all(s.startswith("ggml_") for s in taken), (other, name, sorted(taken))


def _configure(tree: Path, build: Path, args: list[str]) -> str:
    subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", "-DBUILD_SHARED_LIBS=ON",
                    "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_MTMD=OFF",
                    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DLLAVA_BUILD=OFF", *args],
                   check=True, capture_output=True, text=True)
    return (build / "build.ninja").read_text()


def _link_flags(ninja: str) -> dict[str, str]:
    """library file name -> its LINK_FLAGS, from build.ninja's link statements."""
    flags = {}
    for block in re.split(r"\n(?=build )", ninja):
        m = re.match(r"build (\S*lib(ggml[-\w]*|llama)\.so)\S*: \w*(SHARED|MODULE)_LIBRARY_LINKER", block)
        if m:
            lf = re.search(r"^\s+LINK_FLAGS = (.*)$", block, flags=re.M)
            flags[m.group(2)] = lf.group(1) if lf else ""
    return flags


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                    reason="cmake and ninja build the runtime; without them nothing is built")
@pytest.mark.parametrize("layout", ["linked", "loadable"])
def test_every_backend_is_linked_with_the_export_script(tmp_path, layout):
    from kvpot.build.cross import staged_tree

    tree = staged_tree()
    args = ["-DGGML_RPC=ON"]
    if layout == "loadable":
        # the CPU backend as loadable variants, one per x86 level, as distributions build it
        args += ["-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"]
    flags = _link_flags(_configure(tree, tmp_path / layout, args))
    backends = {n: f for n, f in flags.items() if n.startswith("ggml-") and n != "ggml-base"}
    expect_cpu = {"ggml-cpu"} if layout == "linked" else {"ggml-cpu-haswell", "ggml-cpu-x64"}
    assert expect_cpu <= set(backends) and "ggml-rpc" in backends, sorted(flags)
    for name, f in backends.items():
        assert "--version-script=" in f and "kvpot-backend-exports.map" in f, (name, f)
    # the others keep their exports: libllama and libggml-base are what everything links against
    for name in ("llama", "ggml-base", "ggml"):
        assert "kvpot-backend-exports.map" not in flags.get(name, ""), (name, flags.get(name))
    script = next((tmp_path / layout).rglob("kvpot-backend-exports.map")).read_text()
    assert re.sub(r"\s+", " ", script).strip() == "{ global: ggml_*; local: *; };", script
