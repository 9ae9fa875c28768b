"""Reading a document with progress on stderr: a Rich bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet
from kvpot.ingest.sources import STDIN
from kvpot.session.read_point import ReadPoint
from kvpot.session.session import ReadingStopped, ReadProgress, Session
from kvpot.wording import plural

from ._common import err
from ._interrupt import Interrupts

PLAIN_EVERY_S = 5.0   # seconds between progress lines when stderr is not a terminal
EVERY_ENV = "KVPOT_PROGRESS_EVERY"  # another interval for those lines (0: after every chunk)


def plain_every_s() -> float:
    """Seconds between progress lines in a log or a pipe: KVPOT_PROGRESS_EVERY where set (a job that
    watches kvpot's stderr, or a test that must see a line while chunks remain), else PLAIN_EVERY_S."""
    text = os.environ.get(EVERY_ENV, "").strip()
    if not text:
        return PLAIN_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise KvpotError(f"{EVERY_ENV} must be a number of seconds (0 or more), got {text!r}")
    return value


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} tok/s" if speed else "… tok/s")


def _describe(sources: SourceSet) -> str:
    """What is read, as a user names it: "notes.txt, 1.2 MiB", "stdin, 3.0 KiB", "3 files and stdin, ..."."""
    srcs = sources.sources
    streams = [s for s in srcs if s.size is None]
    # a stream read ahead to its end has a known size: what was read
    sizes = [s.size if s.size is not None else (len(s.head) if s.complete else None) for s in srcs]
    if len(srcs) == 1:
        # a focused read's passages (kvpot.session.focus) are held in memory and named by what they come from
        what = "stdin" if srcs[0].path is None and srcs[0].name == STDIN else printable(srcs[0].name)
    else:
        n_files = len(srcs) - len(streams)
        parts = [f"{n_files} file{'s' if n_files != 1 else ''}"] if n_files else []
        parts += ["stdin" if s.path is None else printable(s.name) for s in streams]
        what = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
    if None in sizes:
        return f"{what}, size unknown (a stream)"
    total = sum(sizes)
    size = (f"{total / 2**20:,.1f} MiB" if total >= 2**20 else f"{total / 2**10:,.1f} KiB" if total >= 2**10
            else f"{total} bytes")
    return f"{what}, {size}"


def read_with_progress(session: Session, sources: SourceSet, save: Callable[[], object] | None = None,
                       resume: ReadPoint | None = None) -> bool:
    """Read the sources; returns True when everything was read, False when the user stopped it
    with Ctrl-C and chose to keep what was read. Raises KeyboardInterrupt when they chose not to.
    `save`: saves the context (--save-context); a read stopped by Ctrl-C, SIGTERM or SIGHUP is saved
    before the process ends, to go on later (`--context PATH --continue`). `resume`: the point of a
    reopened context where its stopped read goes on."""
    # before the first line: from then on a Ctrl-C (and, with a save to make, SIGTERM) stops at the next chunk
    with Interrupts(terminate=save is not None) as stop:
        what = _describe(sources)
        if resume is not None:
            what = f"the rest of {what} from token {resume.next_position:,}"
        err.print(f"[bold]reading[/bold] {escape(what)} with {session.policy_spec}, budget "
                  f"{session.settings.budget:,} cells (context {session.engine.ctx.n_ctx:,}), prompt: {session.format.name}",
                  soft_wrap=True)
        try:
            if err.is_terminal:
                _read_rich(session, sources, stop, resume)
            else:
                _read_plain(session, sources, stop, resume)
        except ReadingStopped:
            return _offer_to_keep(session, stop, save)
    _summary(session, sources)
    return True


def _read_rich(session: Session, sources: SourceSet, stop: Interrupts, resume: ReadPoint | None) -> None:
    columns = (TextColumn("[bold]reading"), BarColumn(), TextColumn("{task.completed:,}/{task.fields[est]} tokens"),
               _Rate(), TextColumn("pot {task.fields[cells]:,}/{task.fields[cap]:,}"),
               TextColumn("{task.fields[comp]}"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        # a continued read starts where it stopped (the rate is then of what this read reads)
        task = progress.add_task("read", total=None, completed=session.doc_tokens if resume is not None else 0,
                                 est="?", cells=session.engine.n_cells, cap=session.engine.ctx.n_ctx,
                                 comp=plural(0, "compaction"))

        def on_progress(p: ReadProgress) -> None:
            progress.update(task, completed=p.tokens, total=p.est_total, est=f"~{p.est_total:,}" if p.est_total else "?",
                            cells=p.cells, comp=plural(p.compactions, "compaction"))
            if stop.hit:
                raise ReadingStopped

        session.read(sources, on_progress, resume=resume)


def _read_plain(session: Session, sources: SourceSet, stop: Interrupts, resume: ReadPoint | None) -> None:
    every = plain_every_s()
    t0 = last = time.perf_counter()
    before = session.doc_tokens if resume is not None else 0  # a continued read's rate is of what it reads

    def on_progress(p: ReadProgress) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= every:
            last = now
            of = f" of ~{p.est_total:,}" if p.est_total else ""
            err.print(f"read {p.tokens:,}{of} tokens, {(p.tokens - before) / (now - t0):,.0f} tok/s, pot "
                      f"{p.cells:,}/{p.capacity:,} cells, {plural(p.compactions, 'compaction')}", soft_wrap=True)
        if stop.hit:
            raise ReadingStopped

    session.read(sources, on_progress, resume=resume)


def _summary(session: Session, sources: SourceSet) -> None:
    st = session.stats()
    extra = f", {plural(sources.replaced, 'invalid UTF-8 sequence')} replaced" if sources.replaced else ""
    rate = f" ({st['read tok/s']:,} tok/s)" if "read tok/s" in st else ""
    n = st["document tokens"]
    what = plural(n, "token") if session.read_here == n else f"{session.read_here:,} more tokens ({n:,} in all)"
    err.print(f"read {what} in {session.read_seconds:.1f}s{rate}; "
              f"pot {plural(st['tokens in pot'], 'cell')}, {plural(st['compactions'], 'compaction')}{extra}",
              soft_wrap=True)


class QuestionProgress:
    """Progress of a question too long for the free cells, read through the pot like a document:
    a Rich bar on a terminal, plain lines elsewhere (one when it starts, then every plain_every_s(),
    one when it is read). Nothing is shown for a short question (no progress is reported for it).
    `close()` before the answer is written, so the bar never mixes with it."""

    def __init__(self):
        self._progress: Progress | None = None
        self._task = None
        self._t0 = self._last = 0.0
        self._started = self._done = False
        self._every = plain_every_s()

    def update(self, p: ReadProgress) -> None:
        now = time.perf_counter()
        if not self._started:
            self._started, self._t0, self._last = True, now, now
            err.print(f"[bold]reading the question[/bold] ({p.est_total:,} tokens, more than the free cells) "
                      f"through the pot", soft_wrap=True)
            if err.is_terminal:
                columns = (TextColumn("[bold]question"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} tokens"),
                           _Rate(), TextColumn("pot {task.fields[cells]:,}/{task.fields[cap]:,}"), TimeRemainingColumn())
                self._progress = Progress(*columns, console=err, transient=True)
                self._progress.start()
                self._task = self._progress.add_task("question", total=p.est_total, cells=p.cells, cap=p.capacity)
        if self._progress is not None:
            self._progress.update(self._task, completed=p.tokens, cells=p.cells)
        elif now - self._last >= self._every and p.tokens < (p.est_total or 0):
            self._last = now
            err.print(f"read {p.tokens:,} of {p.est_total:,} question tokens, {p.tokens / (now - self._t0):,.0f} tok/s, "
                      f"pot {p.cells:,}/{p.capacity:,} cells", soft_wrap=True)
        if p.est_total is not None and p.tokens >= p.est_total and not self._done:
            self._done = True
            self.close()
            err.print(f"read the question's {p.tokens:,} tokens in {now - self._t0:.1f}s; pot {p.cells:,} cells, "
                      f"{plural(p.compactions, 'compaction')}", soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _offer_to_keep(session: Session, stop: Interrupts, save: Callable[[], object] | None) -> bool:
    n = session.doc_tokens
    err.print(f"[yellow]stopped[/yellow] after {n:,} tokens")
    if not n:
        save = None  # nothing read: nothing to keep
    elif save is None and session.read_point is not None:
        err.print("(with --save-context PATH a stopped read is saved, and `--context PATH --continue` reads the rest)",
                  soft_wrap=True, markup=False)
    if stop.terminated:
        if save is not None:
            save()
        stop.end_if_terminated()
    if err.is_terminal:
        from rich.prompt import Confirm

        try:
            keep = Confirm.ask(f"keep the {n:,} tokens read so far and go on?", console=err, default=True)
        except (KeyboardInterrupt, EOFError):
            keep = False
    else:
        keep = False
    if not keep:
        if save is not None:
            save()
        raise KeyboardInterrupt
    session.finish_reading()
    return False
