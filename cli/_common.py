"""What every command shares: stderr console for diagnostics, stdout for answers, and the one-line
error contract."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.safe_write import protect, protect_standard_streams, protection_scope

# `ask` and `run` exit with this when the model produced no answer (nothing but whitespace): the
# command ran, but its one product is missing, and a script must be able to tell that from an answer
# (1 is for user errors, 130 for Ctrl-C); `chat` says so on stderr and goes on
NO_ANSWER_EXIT = 5

class _SafeConsole(Console):
    """A Console that shows the control characters in what it prints as visible escapes (kvpot.display):
    a file name or a quote that holds an escape sequence cannot clear the screen or recolour it. Its own
    styles and cursor moves (a progress bar's) are added after this, and pass. Newlines stay: text of
    several lines is printed whole; a name's newline is escaped where the name is put into a line."""

    def _render_buffer(self, buffer) -> str:
        return super()._render_buffer(
            [seg if seg.control else Segment(printable(seg.text, newlines=True), seg.style, seg.control)
             for seg in buffer])


# diagnostics, progress and notices go to stderr; answers, and the reports a command is run for (doctor's,
# models' tables), go to stdout, so that `kvpot doctor > report.txt` and `kvpot models | grep` work
err = _SafeConsole(stderr=True, highlight=False)
out = _SafeConsole(highlight=False)

# how much a command says on stderr: "quiet" (-q: errors only), "normal" (one line of what is read and how, the
# progress, the time an answer took), "verbose" (-v: the plan's details too); reset when the command returns
_verbosity = "normal"


def set_verbosity(verbose: bool = False, quiet: bool = False) -> None:
    """-v and -q of ask, chat and run (serve's log is verbose): from now until the command returns. Quiet
    silences the stderr console; errors are said through it anyway (_say_error)."""
    global _verbosity
    if verbose and quiet:
        raise KvpotError("pass -v (say more) or -q (errors only), not both")
    _verbosity = "verbose" if verbose else "quiet" if quiet else "normal"
    err.quiet = quiet


_started = time.perf_counter()


def elapsed() -> float:
    """Seconds since the command started (user_errors), for --json's total."""
    return time.perf_counter() - _started


def is_verbose() -> bool:
    """-v was given: the detailed lines (the reading plan's reasons, the settings read with)."""
    return _verbosity == "verbose"


def is_quiet() -> bool:
    """-q was given: nothing but errors on stderr."""
    return _verbosity == "quiet"


class _StepLines:
    """rich's Status where stderr is not a terminal, where its spinner draws nothing: each update a line."""

    def update(self, msg: str) -> None:
        err.print(msg, soft_wrap=True, markup=False)


@contextlib.contextmanager
def steps(first: str):
    """Progress of a long job of many steps (a download in parts, a benchmark's cases), updated with
    `.update(msg)`: rich's spinner line in a terminal; in a log or a pipe a line per update, so that it
    shows how far the job got (`first` is the spinner's text before the first step, said only there)."""
    if err.is_terminal:
        with err.status(first) as status:
            yield status
    else:
        yield _StepLines()


def at_most_every(seconds: float, update: Callable[[str], None]) -> Callable[[str], None]:
    """`update`, passed on at most once per `seconds` (the first at once): progress of a read of an hour,
    reported every chunk, as a line a minute in a log rather than one every few seconds."""
    last = -math.inf

    def call(msg: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= seconds:
            last = now
            update(msg)
    return call


class OutputFailed(KvpotError):
    """stdout cannot take the answer (closed, a full disk, a reader that went away)."""


def require_stdout() -> None:
    """Commands that print an answer check stdout before any work: a closed one, or one open only for
    reading, would otherwise be found after the whole document was read. (A full device such as
    /dev/full can only be found by writing: see write_out.)"""
    if sys.stdout is None:  # Python starts with no sys.stdout when fd 1 is closed
        raise OutputFailed("stdout is closed: kvpot writes the answer there "
                           "(redirect it to a file, or to /dev/null to discard it)")
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return  # an in-memory stream (a test runner's): nothing to check
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        raise OutputFailed("stdout is closed: kvpot writes the answer there "
                           "(redirect it to a file, or to /dev/null to discard it)") from None
    if flags & os.O_ACCMODE == os.O_RDONLY:
        raise OutputFailed("stdout is open for reading only: kvpot writes the answer there "
                           "(redirect it to a file, or to /dev/null to discard it)")


def _quiet_stdout() -> None:
    """After stdout failed, point fd 1 at /dev/null so the text still buffered goes nowhere when
    Python flushes at exit, instead of a second error ("Exception ignored ... BrokenPipeError")."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


def write_out(text: str) -> None:
    """Write (and flush) answer text to stdout; a failure is one line (OutputFailed)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        _quiet_stdout()
        raise OutputFailed(f"cannot write the answer to stdout: {e.strerror or e}") from None


def _flush_stdout(report: bool) -> None:
    """Flush stdout at the end of a command, so a failure is said here (`report`) or silenced, never
    left to Python's exit."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as e:
        _quiet_stdout()
        if report:
            raise OutputFailed(f"cannot write to stdout: {e.strerror or e}") from None


def _run_and_flush(fn, *args, **kwargs):
    """Run the command, then flush stdout: a failure to write what it printed is the command's
    error (after an error of its own, that one is said and the flush is silenced)."""
    try:
        result = fn(*args, **kwargs)
    except (KvpotError, KeyboardInterrupt, BrokenPipeError):
        _flush_stdout(report=False)
        raise
    except typer.Exit:
        _flush_stdout(report=True)
        raise
    _flush_stdout(report=True)
    return result


# set by a command given --json (errors_as_json): its errors go to stderr as one JSON object, for scripts
_json_errors = False


def errors_as_json(on: bool) -> None:
    """From now until the command returns, user_errors writes errors as JSON (`--json`)."""
    global _json_errors
    _json_errors = on


def _say_error(message: str, code: int, rich_line: str) -> None:
    """One error, one line: a newline or an escape sequence in it (a file's name) is shown escaped."""
    if _json_errors:
        sys.stderr.write(json.dumps({"error": message, "exit_code": code}) + "\n")
        sys.stderr.flush()
    else:
        was, err.quiet = err.quiet, False  # -q leaves errors
        try:
            err.print(rich_line, soft_wrap=True)
        finally:
            err.quiet = was


def print_error(message: str) -> None:
    """An error the command goes on after (a chat turn's, a failed save): one red line, said under -q too."""
    was, err.quiet = err.quiet, False
    try:
        err.print(f"[red]error:[/red] {escape(printable(message))}", soft_wrap=True)
    finally:
        err.quiet = was


def protect_command_files() -> None:
    """The files every command uses whatever its options (stdin's file, stdout's, kvpot's config, the
    llama.cpp log) join the never-write set before anything else runs; the command adds its inputs,
    model, adapters and stores as it finds them (kvpot.safe_write)."""
    protect_standard_streams()
    from kvpot.runtime.logs import ENV as LLAMA_LOG
    from kvpot.runtime.logs import ROLE as LLAMA_LOG_ROLE
    from kvpot.session.settings import config_path

    with contextlib.suppress(KvpotError):  # a home that cannot be used is refused by what uses it
        protect(config_path(), "kvpot's config")
    log = os.environ.get(LLAMA_LOG)
    if log:
        protect(log, LLAMA_LOG_ROLE)


def user_errors(fn):
    """Turn KvpotError into one red line on stderr (one JSON object under --json) and its exit code;
    Ctrl-C into exit 130. The files the command protects from saves (kvpot.safe_write.protect) are
    protected while it runs."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _started
        _started = time.perf_counter()
        try:
            with protection_scope():
                protect_command_files()
                return _run_and_flush(fn, *args, **kwargs)
        except BrokenPipeError:  # a table or text printed by the command, to a reader that went away
            _quiet_stdout()
            msg = "cannot write to stdout: its reader closed it (broken pipe)"
            _say_error(msg, 1, f"[red]error:[/red] {msg}")
            raise typer.Exit(1) from None
        except KvpotError as e:
            _say_error(str(e), e.exit_code, f"[red]error:[/red] {escape(printable(str(e)))}")
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            _say_error("interrupted", 130, "[yellow]interrupted[/yellow]")
            raise typer.Exit(130) from None
        finally:
            errors_as_json(False)
            set_verbosity()

    return wrapper


RPC_HELP = "HOST:PORT,... of `kvpot rpc-server`s"


def connect_rpc(spec: str | None) -> None:
    """Register the RPC servers' devices before a model loads (each server is checked first)."""
    if spec is None:
        return
    if not spec.strip():
        raise KvpotError("--rpc wants HOST:PORT[,HOST:PORT...], got an empty value (leave --rpc out to run "
                         "on this machine)")
    from kvpot.runtime.rpc import parse_endpoints, use_servers

    endpoints = parse_endpoints(spec)
    devices = use_servers(endpoints)
    err.print(f"RPC: {', '.join(endpoints)} (devices: {', '.join(devices)})", soft_wrap=True)
