"""A signal stops a document chunk's decode in progress (ggml_ext/kvpot-abort.cpp).

Python runs signal handlers between bytecodes, so a Ctrl-C or SIGTERM that arrives during
llama_decode waits for the whole chunk: seconds for a 1.5B model on a laptop, tens of seconds on a
phone. `watch_signals()` (the CLI calls it once) hands the C side a pipe that Python's signal module
writes each signal's number to as it arrives (signal.set_wakeup_fd); a decode armed with `armed()`
stops after the graph node during which something became readable there. llama.cpp then removes
that ubatch's cells, so the decode leaves nothing behind, and `Context.decode` raises `Interrupted`
once Python's own handler has run (it raises for SIGTERM and a second Ctrl-C; a first Ctrl-C only
marks the interrupt, and the reader stops there).

A process that never calls `watch_signals()` (kvpot used as a library) keeps decodes whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

_pipe: tuple[int, int] | None = None  # (read end, write end) given to signal.set_wakeup_fd
_told = None  # the library told the read end (kvpot_abort_watch), once


class Interrupted(Exception):
    """A signal stopped a decode; the cells of that decode were removed, the context is as before it."""


def watch_signals() -> bool:
    """From now on signals reach an armed decode. Main thread only (set_wakeup_fd's rule); False
    where that cannot be (another thread, or a wakeup descriptor someone else installed)."""
    global _pipe
    if _pipe is not None:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)  # the signal handler must never block on a full pipe
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return False
    if old != -1:  # an event loop's descriptor: give it back, decodes stay whole
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return False
    _pipe = (r, w)
    return True


def stop_watching() -> None:
    """Undo watch_signals (tests)."""
    global _pipe, _told
    if _pipe is None:
        return
    signal.set_wakeup_fd(-1)
    if _told is not None:  # the C side must not poll a descriptor number the process may reuse
        _told.kvpot_abort_watch(-1)
        _told = None
    r, w = _pipe
    _pipe = None
    _drain(r)
    os.close(r)
    os.close(w)


def drain() -> list[int]:
    """Empty the pipe: the signal numbers that arrived since the last drain (their Python handlers
    run on their own). A phase of work that starts fresh (reading, answering) drains first, so a
    signal already handled does not stop its first decode."""
    return _drain(_pipe[0]) if _pipe is not None else []


def _drain(fd: int) -> list[int]:
    got: list[int] = []
    while True:
        try:
            chunk = os.read(fd, 512)
        except (BlockingIOError, InterruptedError):
            return got
        if not chunk:
            return got
        got += list(chunk)


def tell(lib) -> bool:
    """Give the library the pipe's read end, once; False where signals are not watched. A model load
    (kvpot_load_progress_release) stops on a waiting signal from then on; a decode only when armed."""
    global _told
    if _pipe is None:
        return False
    if _told is not lib:
        lib.kvpot_abort_watch(_pipe[0])
        _told = lib
    return True


def pending() -> bool:
    """Something is waiting in the pipe (a signal arrived and no phase has drained it yet)."""
    if _pipe is None:
        return False
    import select

    return bool(select.select([_pipe[0]], [], [], 0)[0])


@contextlib.contextmanager
def armed(lib, ctx_ptr, on: bool = True) -> Iterator[None]:
    """Within: a signal stops ctx's decode, when `on` and signals are watched."""
    if not on or not tell(lib):
        yield
        return
    lib.kvpot_abort_arm(ctx_ptr, True)
    try:
        yield
    finally:
        lib.kvpot_abort_arm(ctx_ptr, False)
