"""Ctrl-C as a flag: long work checks it at safe points (between chunks, between answer tokens)
instead of being torn apart mid-update. A second Ctrl-C while the first is pending stops at once."""

from __future__ import annotations

import signal
import threading


class Interrupts:
    def __init__(self):
        self.hit = False
        self._old = None

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self) -> Interrupts:
        self.hit = False
        # a SIGINT the process ignores stays ignored (a job started with `&` from a script, or under
        # `nohup ... &`: its reader chose not to be stopped by an interrupt meant for the shell)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
