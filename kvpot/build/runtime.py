"""Build (or take from the cache) and install the patched llama-cpp-python wheel.

Steps: verified sdist → pristine tree (extracted once) → staged copy with patches/series
applied and ggml_ext/ copied in → synced into a persistent source tree, rewriting only
files whose bytes changed, so cmake's persistent build dir recompiles only what changed
→ `pip wheel` → wheel cached under the cache key → installed.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kvpot import paths
from kvpot.build.cache_key import cache_key
from kvpot.build.native import native_target
from kvpot.build.patching import apply_series
from kvpot.build.pins import LLAMA_CPP_COMMIT, SDIST_VERSION, VENDOR_DIR
from kvpot.build.sdist import extract_pristine, fetch_sdist
from kvpot.errors import BuildError
from kvpot.version import __version__

# options kvpot always adds: multimodal (mtmd) is not used and costs a third of the build;
# the RPC backend (one source file, ggml-rpc) lets `kvpot ask --rpc` spread a model over machines
KVPOT_CMAKE_ARGS = "-DLLAVA_BUILD=OFF -DGGML_RPC=ON"


@dataclass
class BuildResult:
    key: str
    wheel: Path
    version: str
    cached: bool
    installed: bool
    seconds: float


def source_root() -> Path:
    """The kvpot checkout that holds patches/ and ggml_ext/."""
    root = Path(__file__).resolve().parents[2]  # kvpot/build/runtime.py in the checkout
    if not (root / "patches" / "series").is_file() or not (root / "ggml_ext").is_dir():
        raise BuildError(f"{root} is not a kvpot source checkout (patches/series, ggml_ext/); build from a clone")
    return root


def full_cmake_args(user_args: str | None = None) -> str:
    user = os.environ.get("CMAKE_ARGS", "") if user_args is None else user_args
    return " ".join(f"{user} {KVPOT_CMAKE_ARGS}".split())


def variant_dirs(bdir: Path, args: str) -> tuple[Path, Path]:
    """The persistent source tree and cmake build dir: one pair per set of CMake arguments, so that a
    second backend's build (CMAKE_ARGS=-DGGML_VULKAN=ON, `make test-vulkan`) never reconfigures the CPU
    build's tree nor rewrites its sources while it compiles (cmake binds a build dir to one source dir)."""
    if args == full_cmake_args(""):
        return bdir / "src", bdir / "cmake"
    tag = hashlib.sha256(args.encode()).hexdigest()[:12]
    return bdir / f"src-{tag}", bdir / f"cmake-{tag}"


def wheel_version(key: str) -> str:
    return f"{SDIST_VERSION}+kvpot.{key[:12]}"


def installed_version() -> str | None:
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def _sync_tree(src: Path, dst: Path) -> int:
    """Make dst hold exactly src's files, touching only files whose content differs."""
    changed = 0
    dst.mkdir(parents=True, exist_ok=True)
    seen: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        seen.add(rel)
        for name in filenames:
            s, d = Path(dirpath) / name, dst / rel / name
            seen.add(rel / name)
            if d.is_file() and filecmp.cmp(s, d, shallow=False):
                continue
            shutil.copy2(s, d)
            os.utime(d)  # newer than anything cmake built from the old content
            changed += 1
    for dirpath, dirnames, filenames in os.walk(dst, topdown=False):
        rel = Path(dirpath).relative_to(dst)
        for name in filenames:
            if rel / name not in seen:
                (Path(dirpath) / name).unlink()
        if rel not in seen:
            shutil.rmtree(dirpath, ignore_errors=True)
    return changed


def _stage(root: Path, pristine: Path, stage: Path, version: str) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(pristine, stage, symlinks=True)
    vendor = stage / VENDOR_DIR
    apply_series(root / "patches", vendor)
    shutil.copytree(root / "ggml_ext", vendor / "ggml_ext", ignore=shutil.ignore_patterns("__pycache__"))
    init = stage / "llama_cpp" / "__init__.py"
    text = init.read_text()
    old = f'__version__ = "{SDIST_VERSION}"'
    if old not in text:
        raise BuildError(f"unexpected llama_cpp/__init__.py in the sdist: no {old}")
    init.write_text(text.replace(old, f'__version__ = "{version}"'))


def _run_logged(cmd: list[str], env: dict, log: Path, say) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    tty = sys.stderr.isatty()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            # ninja's "[12/345] Building ..." lines make a usable progress indicator
            if tty and line.startswith("[") and "/" in line.split("]", 1)[0]:
                print("\r" + line.strip()[:100].ljust(100), end="", file=sys.stderr)
        rc = proc.wait()
    if tty:
        print(file=sys.stderr)
    if rc != 0:
        tail = log.read_text().strip().splitlines()[-15:]
        say("\n".join(tail))
        raise BuildError(f"building the patched llama-cpp-python failed (exit {rc}); full log: {log}")


def install_wheel(wheel: Path, version: str, say) -> bool:
    if installed_version() == version:
        return False
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q", str(wheel)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"pip could not install {wheel.name}: {res.stderr.strip().splitlines()[-1:]}")
    say(f"installed {wheel.name}")
    return True


def build_runtime(cmake_args: str | None = None, jobs: int | None = None, force: bool = False,
                  install: bool = True, say=lambda msg: print(msg, file=sys.stderr)) -> BuildResult:
    t0 = time.monotonic()
    root = source_root()
    args = full_cmake_args(cmake_args)
    target = native_target(args)
    key = cache_key(root / "patches", root / "ggml_ext", args, target.fingerprint)
    version = wheel_version(key)
    bdir = paths.build_dir()
    wheel_dir = bdir / "wheels" / key
    found = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    cached = bool(found) and not force
    if cached:
        wheel = found[0]
        say(f"patched runtime {version} found in the cache")
    else:
        sdist = fetch_sdist(bdir / "sdist")
        pristine = extract_pristine(sdist, bdir)
        stage = bdir / f"stage-{key[:12]}"
        _stage(root, pristine, stage, version)
        src, cmake_dir = variant_dirs(bdir, args)
        changed = _sync_tree(stage, src)
        shutil.rmtree(stage, ignore_errors=True)
        say(f"building patched llama-cpp-python {version} ({changed} source files changed; "
            f"CMAKE_ARGS='{args}'); a cold build takes several minutes")
        say(f"CPU target: {target.describe()}")
        env = dict(os.environ)
        env["CMAKE_ARGS"] = f"{args} -DKVPOT_VERSION_STR={__version__} -DKVPOT_LLAMA_COMMIT={LLAMA_CPP_COMMIT}"
        env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs or os.cpu_count() or 2)
        out = bdir / f"wheel-out-{key[:12]}"  # per key: two backends may build side by side
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out),
               "--config-settings=build-dir=" + str(cmake_dir), str(src)]
        _run_logged(cmd, env, bdir / "logs" / f"{key[:12]}.log", say)
        built = sorted(out.glob("*.whl"))
        if not built:
            raise BuildError(f"pip wheel produced no wheel in {out}")
        shutil.rmtree(wheel_dir, ignore_errors=True)
        wheel_dir.mkdir(parents=True)
        wheel = wheel_dir / built[0].name
        shutil.move(str(built[0]), wheel)
        shutil.rmtree(out, ignore_errors=True)
    did_install = install_wheel(wheel, version, say) if install else False
    return BuildResult(key=key, wheel=wheel, version=version, cached=cached, installed=did_install,
                       seconds=time.monotonic() - t0)
