"""Writing a file the user named without harming what is there: saved contexts and pulled models.

- Only a regular file or a new name is replaced. A symlink is followed: the file it points to is
  written and the link stays (docs/formats.md). A directory, device, FIFO or socket is refused.
- The bytes go to a hidden temporary file beside the target, named `.NAME.PID.RANDOM.tmp`, which
  is renamed over the target only when complete and flushed.
- SIGTERM and SIGHUP while writing remove the temporary file before the process ends; a file left
  by a kill -9 (its PID no longer runs) is removed by the next write to the same target.
- OS errors (full disk, file-size limit, permissions) become one KvpotError line.
- The never-write set: a file the running command reads, runs or writes on its own (its inputs as
  read and as named, stdin's and stdout's files, every file under an input folder, the model, the
  adapters, a block store, kvpot's config, the llama.cpp log, a reopened context's recorded inputs)
  is never replaced. It is built once per command: `protect` (a file), `protect_folder` (everything
  under a folder) and `protect_standard_streams` register, and every writer asks `protected_role`
  through `resolve_target` (whole-file saves) or `check_append_target` (logs opened by C), so a
  target that is one of them is refused (the same file through a symlink or a hard link included).
  tests/test_never_write.py walks the package and fails on a write that goes around this check.
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


# files the running command reads or runs: real path -> what it is, for the refusal ("the model"); a file
# may be several things at once (the log named as the model), and each is kept
_protected: dict[str, list[str]] = {}
# folders whose every file is protected (an input folder: what --glob, --exclude or .gitignore left out too)
_protected_folders: dict[str, str] = {}
# files known only by an open descriptor (stdin redirected from a file): (st_dev, st_ino) -> what it is.
# The descriptor stays open while the command runs, so the inode cannot be freed and reused meanwhile
_protected_ids: dict[tuple[int, int], str] = {}


def protect(path: Path | str, role: str) -> None:
    """Never let a save replace `path` (through any name) while this command runs. A path that does
    not exist yet (a block store made while reading) is protected by its name."""
    roles = _protected.setdefault(os.path.realpath(Path(path).expanduser()), [])
    if role not in roles:
        roles.append(role)


def protect_folder(path: Path | str, role: str) -> None:
    """Never let a save replace any file under the folder `path` (a new file there is fine)."""
    _protected_folders.setdefault(os.path.realpath(Path(path).expanduser()), role)


def protect_descriptor(fd: int, role: str) -> None:
    """Never let a save replace the regular file open as `fd` (a pipe or terminal has no name to save over)."""
    try:
        st = os.fstat(fd)
    except (OSError, ValueError):
        return
    if stat.S_ISREG(st.st_mode):
        _protected_ids.setdefault((st.st_dev, st.st_ino), role)


def protect_standard_streams() -> None:
    """stdin's file (`kvpot ask ... < doc.txt`, read with or without `-`) and the files stdout and stderr
    go to: a save over one would replace a document or the output the user is keeping."""
    protect_descriptor(0, "stdin's file (the input redirected with <)")
    protect_descriptor(1, "the file stdout goes to")
    protect_descriptor(2, "the file stderr goes to")


@contextlib.contextmanager
def protection_scope() -> Iterator[None]:
    """Files protected inside the block are forgotten after it (one CLI command, one test)."""
    saved = {k: list(v) for k, v in _protected.items()}, dict(_protected_folders), dict(_protected_ids)
    try:
        yield
    finally:
        for now, before in zip((_protected, _protected_folders, _protected_ids), saved):
            now.clear()
            now.update(before)


def protected_role(path: Path | str, ignore: str | None = None) -> str | None:
    """What `path` is to the running command when a save there would replace a protected file: the
    same name, or the same inode (st_dev, st_ino) as one, each compared now (an inode number a
    deleted file freed may belong to another file since), or a file under a protected folder.
    `ignore`: a role that does not count (the log's own, when the log itself is checked)."""
    real = os.path.realpath(Path(path).expanduser())
    for role in _protected.get(real, ()):
        if role != ignore:
            return role
    try:
        st = os.stat(real)
    except OSError:
        return None  # a new name: nothing there to replace
    if (st.st_dev, st.st_ino) in _protected_ids:
        return _protected_ids[(st.st_dev, st.st_ino)]
    for known, roles in _protected.items():
        try:
            other = os.stat(known)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            for role in roles:
                if role != ignore:
                    return role
    return _folder_role(real)


def _folder_role(real: str) -> str | None:
    """What protected folder holds the existing file `real`: by path, and by the folders' inodes (the
    same folder reached through a bind mount or another symlinked name)."""
    if not _protected_folders:
        return None
    folder_ids = {}
    for folder, role in _protected_folders.items():
        if real.startswith(folder.rstrip(os.sep) + os.sep):
            return f"a file inside {role}"
        with contextlib.suppress(OSError):
            fst = os.stat(folder)
            folder_ids[(fst.st_dev, fst.st_ino)] = role
    parent = os.path.dirname(real)
    while True:
        try:
            pst = os.stat(parent)
        except OSError:
            return None
        role = folder_ids.get((pst.st_dev, pst.st_ino))
        if role is not None:
            return f"a file inside {role}"
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


def check_append_target(path: Path | str, what: str, own_role: str | None = None) -> Path:
    """A file that C will open for appending (the llama.cpp log): a regular file or a new name in an
    existing folder, a terminal, or /dev/null, and never a protected file. A FIFO would block the open
    forever and another device may take no writes (/dev/full), so both are refused here, before C opens it.
    `own_role`: the role the target itself was protected under (the log is protected from saves)."""
    if str(path) == "":
        raise KvpotError(f"{what}: the path is empty")
    path = Path(path).expanduser()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise KvpotError(f"{what} is a symbolic link to a missing file") from None
        if not path.parent.is_dir():
            raise KvpotError(f"{what}: folder {path.parent} does not exist") from None
        return path
    except OSError as e:
        raise KvpotError(f"{what}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise KvpotError(f"{what} is a directory; name a file")
    if stat.S_ISCHR(st.st_mode):
        with contextlib.suppress(OSError):
            if os.path.samefile(path, os.devnull):
                return path
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            raise KvpotError(f"{what}: {e.strerror}") from None
        try:
            if os.isatty(fd):
                return path
        finally:
            os.close(fd)
        raise KvpotError(f"{what} is a device; name a file, a terminal or {os.devnull}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (the log would wait for a reader forever)" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise KvpotError(f"{what} is {kind}; name a file")
    role = protected_role(path, ignore=own_role)
    if role is not None:
        raise KvpotError(f"{what} is {role}, which this command uses (the log would be written into it); "
                         "name another file")
    return path


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


def write_text_file(path: Path | str, text: str, what: str = "file") -> None:
    """`text` (UTF-8) written to `path` as atomic_write writes: a benchmark's JSON, a report."""
    with atomic_write(path, what) as f:
        f.write(text.encode("utf-8"))
