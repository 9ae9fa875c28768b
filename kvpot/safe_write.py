"""Writing a file the user named without harming what is there: saved contexts and pulled models.

- Only a regular file or a new name is replaced. A symlink is followed: the file it points to is
  written and the link stays (docs/formats.md). A directory, device, FIFO or socket is refused.
- The bytes go to a hidden temporary file beside the target, named `.NAME.PID.RANDOM.tmp`, which
  is renamed over the target only when complete and flushed.
- SIGTERM and SIGHUP while writing remove the temporary file before the process ends; a file left
  by a kill -9 (its PID no longer runs) is removed by the next write to the same target.
- OS errors (full disk, file-size limit, permissions) become one KvpotError line.
- A file the running command reads or runs (its inputs, the model, an adapter, a block store) is
  never replaced: a command registers each with `protect`, and every write refuses a target that
  is one of them (the same file through a symlink or a hard link included).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from kvpot.errors import KvpotError

_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


# files the running command reads or runs: real path -> what it is, for the refusal ("the model")
_protected: dict[str, str] = {}


def protect(path: Path | str, role: str) -> None:
    """Never let a save replace `path` (through any name) while this command runs. A path that does
    not exist yet (a block store made while reading) is protected by its name."""
    _protected.setdefault(os.path.realpath(Path(path).expanduser()), role)


@contextlib.contextmanager
def protection_scope() -> Iterator[None]:
    """Files protected inside the block are forgotten after it (one CLI command, one test)."""
    saved = dict(_protected)
    try:
        yield
    finally:
        _protected.clear()
        _protected.update(saved)


def protected_role(path: Path | str) -> str | None:
    """What `path` is to the running command when a save there would replace a protected file: the
    same name, or the same inode (st_dev, st_ino) as one, each compared now (an inode number a
    deleted file freed may belong to another file since)."""
    real = os.path.realpath(Path(path).expanduser())
    if real in _protected:
        return _protected[real]
    try:
        st = os.stat(real)
    except OSError:
        return None
    for known, role in _protected.items():
        try:
            other = os.stat(known)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return role
    return None


def resolve_target(path: Path | str, what: str = "file") -> Path:
    """The path the bytes will land at (a symlink followed), checked to be a regular file or new."""
    if str(path) == "":
        raise KvpotError(f"cannot save the {what}: the path is empty")
    path = Path(path).expanduser()
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # write where the link points; the link stays a link
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise KvpotError(f"cannot save the {what} to {path}: {e.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise KvpotError(f"cannot save the {what} to {path}: it is a directory (name a file inside it)")
        if not stat.S_ISREG(st.st_mode):
            raise KvpotError(f"cannot save the {what} to {path}: it exists and is not a regular file")
    role = protected_role(path)
    if role is not None:
        raise KvpotError(f"cannot save the {what} to {path}: it is {role}, which this command uses "
                         "(saving would replace it); name another file")
    folder = path.parent
    if not folder.is_dir():
        raise KvpotError(f"cannot save the {what}: folder {folder} does not exist")
    try:  # a file made and dropped there: also a folder that takes none (read-only mount, /proc) fails now,
        # before the reading, where a permission check alone would pass (root, a read-only file system)
        tempfile.TemporaryFile(dir=folder).close()
    except PermissionError:
        raise KvpotError(f"cannot save the {what} to {path}: folder {folder} is not writable") from None
    except OSError as e:
        raise KvpotError(f"cannot save the {what} to {path}: {e.strerror}") from None
    return path


def temp_pattern(target: Path) -> re.Pattern:
    """Names of temporary files written for `target` (also older kvpot's `.NAME.XXXXXXXX.tmp`)."""
    return re.compile(rf"^\.{re.escape(target.name)}\.(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove temporary files a killed writer left for `target`; ones whose writer runs stay."""
    pat = temp_pattern(target)
    removed = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        pid = m.group("pid")
        if pid is not None and (int(pid) == os.getpid() or _pid_alive(int(pid))):
            continue
        p = target.parent / name
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


class _Signalled(BaseException):
    """SIGTERM or SIGHUP arrived while writing: clean up, then end as the signal would."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Signalled(signum)

    # a signal the process ignores stays ignored (under nohup, SIGHUP must not interrupt a save)
    old = {s: signal.signal(s, handler) for s in _SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _oserror(what: str, path: Path, e: OSError) -> KvpotError:
    reason = e.strerror or str(e)
    if e.errno == errno.EFBIG:
        reason += " (the file-size limit, ulimit -f)"
    return KvpotError(f"cannot save the {what} to {path}: {reason}")


@contextlib.contextmanager
def atomic_write(path: Path | str, what: str = "file") -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit it replaces `path` (checked by resolve_target)."""
    target = resolve_target(path, what)
    remove_stale_temps(target)
    tmp = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    signalled: _Signalled | None = None
    try:
        with _signals_raise():
            try:
                with open(tmp, "xb") as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            except _Signalled as s:
                signalled = s
                raise
            except OSError as e:
                raise _oserror(what, target, e) from None
            finally:
                if tmp.exists():
                    tmp.unlink()
    except _Signalled:
        pass
    if signalled is not None:
        # the temporary file is gone: deliver the signal again to the handler that was there before
        # (by default it ends the process, exit status 128 + signum); if that one returns, say so
        signal.raise_signal(signalled.signum)
        raise KvpotError(f"saving the {what} to {target} was interrupted by signal {signalled.signum}")
