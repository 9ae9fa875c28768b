"""Ctrl-C as a flag: long work checks it at safe points (between chunks, between answer tokens)
instead of being torn apart mid-update. A second Ctrl-C while the first is pending stops at once.
SIGTERM and SIGHUP end the command at once, but as an exit that runs the cleanup (exit_cleanly_on_signals).

"At once" includes a document chunk's decode in progress: kvpot.runtime.abort stops it after the graph
node the signal arrived in, and llama.cpp takes the chunk back, so reading ends with the chunks before it."""

from __future__ import annotations

import signal
import sys
import threading

from kvpot.runtime import abort


class Interrupts:
    def __init__(self, terminate: bool = False):
        """`terminate`: SIGTERM and SIGHUP stop the phase as a first Ctrl-C does (`terminated` says which),
        so that what it did can be kept before the process ends as the signal asks (a read that is saved
        to go on later, under `timeout` or a phone's task killer); a second one ends it at once."""
        self.hit = False
        self.terminated = 0
        self.terminate = terminate
        self._old = None
        self._old_term: dict[int, object] = {}

    def _handler(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def _term_handler(self, signum, frame):
        if self.terminated:
            end_by_signal(signum)
        self.terminated, self.hit = signum, True

    def __enter__(self) -> Interrupts:
        self.hit = False
        abort.drain()  # a signal handled before this phase must not stop its first decode
        # a SIGINT the process ignores stays ignored (a job started with `&` from a script, or under
        # `nohup ... &`: its reader chose not to be stopped by an interrupt meant for the shell)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._old = signal.signal(signal.SIGINT, self._handler)
        if self.terminate and threading.current_thread() is threading.main_thread():
            for name in ("SIGTERM", "SIGHUP"):
                sig = getattr(signal, name, None)
                if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old_term[sig] = signal.signal(sig, self._term_handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
        for sig, old in self._old_term.items():
            signal.signal(sig, old)
        self._old_term = {}

    def end_if_terminated(self) -> None:
        """A SIGTERM or SIGHUP that stopped the phase ends the process now, as exit_cleanly_on_signals does."""
        if self.terminated:
            end_by_signal(self.terminated)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP: the process ends as after an error, so `finally` blocks, context managers and
    exit handlers run (InfLLM deletes its block store; a save in progress removes its temporary file)."""


def end_by_signal(signum: int) -> None:
    """The one way a SIGTERM or SIGHUP ends kvpot: one line, then exit status 128 + signal number (the
    status a shell reports for a process the signal killed) through the usual unwinding."""
    sys.stderr.write(f"kvpot: stopped by {signal.Signals(signum).name}\n")
    raise Terminated(128 + signum)


def exit_cleanly_on_signals() -> None:
    """Called once by the CLI before any command runs: SIGTERM and SIGHUP end it with exit status
    128 + signal number, the status a shell reports for a process the signal killed, after the
    cleanup above. A signal the process ignores stays ignored (`nohup` leaves SIGHUP ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    abort.watch_signals()

    def handler(signum, frame):
        end_by_signal(signum)  # a second signal during cleanup is the same exit again

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)
