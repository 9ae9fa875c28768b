"""Plain CMake builds of the patched libllama (no Python wheel) for another CPU, and of tests/pot_check.

`python -m kvpot.build.cross aarch64` stages the same patched tree as the wheel build (pinned sdist,
patches/series, ggml_ext/), configures vendor/llama.cpp for aarch64 Linux with the GNU cross
compiler and builds only the `llama` library target, then links tests/pot_check.cpp against it.
`python -m kvpot.build.cross native` links pot_check against the libllama of the installed wheel.
Run the aarch64 binary with qemu-aarch64-static (see `make test-aarch64` and docs/termux.md).

The aarch64 target is a phone-class CPU (-march=armv8.2-a+dotprod+fp16, as on Snapdragon 855 and
later); ggml's CPU_REPACK buffer then repacks Q4_0 weights for its dot-product kernels.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kvpot import paths
from kvpot.build.pins import VENDOR_DIR
from kvpot.build.runtime import _stage, _sync_tree, source_root, wheel_version
from kvpot.build.sdist import extract_pristine, fetch_sdist
from kvpot.errors import BuildError

AARCH64_MARCH = "armv8.2-a+dotprod+fp16"
AARCH64_PREFIX = "aarch64-linux-gnu-"


def _run(cmd: list[str], log, cwd: Path | None = None, env: dict | None = None) -> None:
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise BuildError(f"{cmd[0]} failed (exit {rc}); log: {log.name}")


def staged_tree() -> Path:
    """The patched llama.cpp source for plain CMake builds, kept in $KVPOT_HOME/build/src-plain."""
    root = source_root()
    bdir = paths.build_dir()
    pristine = extract_pristine(fetch_sdist(bdir / "sdist"), bdir)
    stage = bdir / "stage-plain"
    _stage(root, pristine, stage, wheel_version("0" * 12))
    src = bdir / "src-plain"
    _sync_tree(stage, src)
    shutil.rmtree(stage, ignore_errors=True)
    return src / VENDOR_DIR


def _toolchain(path: Path) -> Path:
    path.write_text(f"""set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER {AARCH64_PREFIX}gcc)
set(CMAKE_CXX_COMPILER {AARCH64_PREFIX}g++)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
""")
    return path


def build_aarch64(jobs: int, out: Path, log) -> Path:
    for tool in (f"{AARCH64_PREFIX}gcc", f"{AARCH64_PREFIX}g++"):
        if not shutil.which(tool):
            raise BuildError(f"{tool} not found; install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu")
    llama = staged_tree()
    bdir = paths.build_dir() / "cmake-aarch64"
    bdir.mkdir(parents=True, exist_ok=True)
    tc = _toolchain(bdir / "aarch64.cmake")
    _run(["cmake", "-S", str(llama), "-B", str(bdir), "-G", "Ninja" if shutil.which("ninja") else "Unix Makefiles",
          f"-DCMAKE_TOOLCHAIN_FILE={tc}", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
          "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={AARCH64_MARCH}", "-DGGML_OPENMP=OFF",
          "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
          "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_MTMD=OFF", "-DLLAMA_OPENSSL=OFF"],
         log)
    _run(["cmake", "--build", str(bdir), "--target", "llama", "-j", str(jobs)], log)
    libs = [p for p in bdir.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    out.mkdir(parents=True, exist_ok=True)
    for p in bdir.rglob("*.so*"):
        if p.name.startswith(("libllama", "libggml")):
            dst = out / p.name
            if dst.exists() or dst.is_symlink():
                dst.unlink()
            if p.is_symlink():
                dst.symlink_to(os.readlink(p))
            else:
                shutil.copy2(p, dst)
    if not libs:
        raise BuildError(f"no shared libraries under {bdir}")
    return _link_pot_check(f"{AARCH64_PREFIX}g++", llama, out, out / "pot_check", log)


def _link_pot_check(cxx: str, llama: Path, lib_dir: Path, exe: Path, log) -> Path:
    test_src = source_root() / "tests" / "pot_check.cpp"
    _run([cxx, "-O2", "-std=c++17", str(test_src), "-o", str(exe),
          f"-I{llama / 'include'}", f"-I{llama / 'ggml' / 'include'}", f"-I{llama / 'ggml_ext'}",
          f"-L{lib_dir}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib_dir}"], log)
    return exe


def build_native(out: Path, log) -> Path:
    """pot_check against the libllama that the installed llama_cpp wheel ships (this machine's CPU)."""
    try:
        import llama_cpp.llama_cpp as raw
    except ImportError:
        raise BuildError("llama_cpp is not installed; run `make install` first") from None
    lib_dir = Path(raw._lib._name).parent
    out.mkdir(parents=True, exist_ok=True)
    return _link_pot_check(os.environ.get("CXX", "c++"), staged_tree(), lib_dir, out / "pot_check", log)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m kvpot.build.cross", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=["aarch64", "native"])
    ap.add_argument("--out", type=Path, help="where the binary (and for aarch64 the libraries) go")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ns = ap.parse_args()
    out = ns.out or paths.build_dir() / f"pot-check-{ns.target}"
    log_path = paths.build_dir() / "logs" / f"cross-{ns.target}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        with open(log_path, "w") as log:
            exe = build_aarch64(ns.jobs, out, log) if ns.target == "aarch64" else build_native(out, log)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{exe} built in {time.monotonic() - t0:.0f}s (log {log_path})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
