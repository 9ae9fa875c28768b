"""Build (or find cached) the unpatched llama.cpp that kvpot's runtime is patched from: the reference of
every speed and memory ratio ("stock as users run it", kvpot.bench.stock_upstream).

The source is the pristine tree of the verified sdist (kvpot.build.sdist, extracted once), configured
with plain CMake into a build folder of its own (`cmake -S pristine -B build`: nothing is written into
the pristine tree, and patches/series is never applied). Only the `llama` target is built: libllama and
the ggml libraries it links, no tools, no common library. The shared libraries stay where llama.cpp's
CMake puts them, $KVPOT_HOME/build/upstream-KEY/cmake/bin, with identity.json in the folder above,
written last: a folder with it is a finished build, reused by every later call.

CPU flags follow the runtime's choice: the same CMAKE_ARGS (ggml's -march=native unless they say
GGML_NATIVE=OFF) and the same native-target fingerprint in the cache key, so a KVPOT_HOME shared by two
machines never hands one the other's build. Like the runtime, the build leaves out ggml's AMX matmul
path where the compiler would put it in (llama.cpp issue 20824: it segfaults on some Sapphire Rapids
machines): `-mno-amx-*` in CMAKE_C_FLAGS/CMAKE_CXX_FLAGS, which GCC and Clang honour over -march=native
whatever their order. Everywhere else the flags are upstream's defaults.

`python -m kvpot.build.upstream` builds it and prints the library folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvpot import paths
from kvpot.build.native import native_target
from kvpot.build.pins import LLAMA_CPP_COMMIT, SDIST_SHA256, SDIST_VERSION, VENDOR_DIR
from kvpot.build.sdist import extract_pristine, fetch_sdist
from kvpot.errors import BuildError

# bump when the recipe below changes in a way that alters the libraries
RECIPE_VERSION = "1"
# only libllama and what it links: no tools, tests, examples, server or common library (and no curl)
FIXED_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
              "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# llama-cpp-python's own option (its multimodal library), which a plain llama.cpp configure does not know
_WHEEL_ONLY = ("-DLLAVA_BUILD=",)


@dataclass(frozen=True)
class UpstreamBuild:
    """A finished build: where its libraries are and what it was built from and with."""
    lib_dir: str
    key: str
    sdist_version: str
    sdist_sha256: str
    llama_cpp_commit: str
    cmake_args: list[str]
    cpu_target: str
    native_fingerprint: str
    amx: str
    seconds: float

    def identity(self) -> dict:
        """What a benchmark JSON records of the build (everything but the build's duration)."""
        return {k: v for k, v in asdict(self).items() if k != "seconds"}


def user_cmake_args() -> list[str]:
    """The runtime's CMAKE_ARGS (the ones kvpot.build.runtime takes), less llama-cpp-python's own options."""
    return [a for a in shlex.split(os.environ.get("CMAKE_ARGS", "")) if not a.startswith(_WHEEL_ONLY)]


def plan() -> tuple[str, list[str], object]:
    """(cache key, full CMake arguments, native target) for this machine and CMAKE_ARGS."""
    user = user_cmake_args()
    target = native_target(" ".join(user))
    args = [*FIXED_ARGS, *user]
    if any(f.startswith("__AMX") for f in target.features):
        args += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    h = hashlib.sha256()
    for tag, data in (("recipe", RECIPE_VERSION), ("sdist", SDIST_SHA256), ("args", "\n".join(args)),
                      ("native", target.fingerprint)):
        h.update(f"{tag}:{len(data)}:{data}".encode())
    return h.hexdigest(), args, target


def build_folder(key: str) -> Path:
    return paths.build_dir() / f"upstream-{key[:12]}"


def find_cached() -> UpstreamBuild | None:
    """The finished build for this machine and CMAKE_ARGS, or None."""
    key, _, _ = plan()
    ident = build_folder(key) / "identity.json"
    if not ident.is_file():
        return None
    try:
        return UpstreamBuild(**json.loads(ident.read_text()))
    except (ValueError, TypeError):
        return None


def _check_tools() -> str:
    missing = [t for t in ("cmake",) if not shutil.which(t)]
    cc = native_target("").compiler or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), "")
    cxx = os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), "")
    if not cc:
        missing.append("a C compiler (cc)")
    if not cxx:
        missing.append("a C++ compiler (c++)")
    if missing:
        raise BuildError(f"cannot build unpatched llama.cpp: no {' and no '.join(missing)} on PATH; "
                         "install them (Debian: apt install build-essential cmake)")
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def build_upstream(jobs: int | None = None, say=lambda msg: print(msg, file=sys.stderr)) -> UpstreamBuild:
    """The cached build, else a fresh one (several minutes on 2 cores); BuildError in one line on failure."""
    cached = find_cached()
    if cached is not None:
        return cached
    t0 = time.monotonic()
    generator = _check_tools()
    key, args, target = plan()
    bdir = paths.build_dir()
    pristine = extract_pristine(fetch_sdist(bdir / "sdist"), bdir) / VENDOR_DIR
    if not (pristine / "include" / "llama.h").is_file():
        raise BuildError(f"{pristine} holds no include/llama.h; remove {pristine.parent.parent} and build again")
    out = build_folder(key)
    cmake_dir = out / "cmake"
    lib_dir = cmake_dir / "bin"  # llama.cpp puts every library there; libllama finds ggml's through its RUNPATH
    log_path = bdir / "logs" / f"upstream-{key[:12]}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"building unpatched llama.cpp {LLAMA_CPP_COMMIT} (libllama only) into {out}; CPU target: "
        f"{target.describe()}; a cold build takes several minutes")
    steps = [["cmake", "-S", str(pristine), "-B", str(cmake_dir), "-G", generator, *args],
             ["cmake", "--build", str(cmake_dir), "--target", "llama", "-j", str(jobs or os.cpu_count() or 2)]]
    with open(log_path, "w") as log:
        for cmd in steps:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            except OSError as e:
                raise BuildError(f"cannot run {cmd[0]}: {e.strerror}") from None
            if rc != 0:
                raise BuildError(f"building unpatched llama.cpp failed ({cmd[1]} {cmd[2]}, exit {rc}); log: {log_path}")
    if not (lib_dir / "libllama.so").exists() and not (lib_dir / "libllama.dylib").exists():
        raise BuildError(f"the unpatched build left no libllama under {cmake_dir}; log: {log_path}")
    res = UpstreamBuild(lib_dir=str(lib_dir), key=key, sdist_version=SDIST_VERSION, sdist_sha256=SDIST_SHA256,
                        llama_cpp_commit=LLAMA_CPP_COMMIT, cmake_args=args, cpu_target=target.describe(),
                        native_fingerprint=target.fingerprint,
                        amx="left out (-mno-amx-*)" if NO_AMX in " ".join(args) else "not in the CPU target",
                        seconds=time.monotonic() - t0)
    tmp = out / "identity.json.tmp"
    tmp.write_text(json.dumps(asdict(res), indent=1) + "\n")
    os.replace(tmp, out / "identity.json")  # last: the folder is a finished build from here on
    return res


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvpot.build.upstream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    ns = ap.parse_args()
    try:
        res = build_upstream(ns.jobs)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"unpatched llama.cpp {res.llama_cpp_commit} ({res.cpu_target}): {res.lib_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
