"""Reading a document with progress on stderr: a Rich bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from kvpot.api import ReadingStopped, ReadPoint, ReadProgress
from kvpot.api.plan import estimated_tokens
from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet
from kvpot.ingest.sources import STDIN
from kvpot.session.settings import reads_in_full
from kvpot.wording import plural

from ._common import err, is_verbose
from ._interrupt import Interrupts

if TYPE_CHECKING:
    from kvpot.session.session import Session

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


def _named(sources: SourceSet) -> str:
    """What is read, as a user names it: "notes.txt", "stdin", "3 files and stdin"."""
    srcs = sources.sources
    if len(srcs) == 1:
        # a focused read's passages (kvpot.session.focus) are held in memory and named by what they come from
        return "stdin" if srcs[0].path is None and srcs[0].name == STDIN else printable(srcs[0].name)
    streams = [s for s in srcs if s.size is None]
    n_files = len(srcs) - len(streams)
    parts = [f"{n_files} file{'s' if n_files != 1 else ''}"] if n_files else []
    parts += ["stdin" if s.path is None else printable(s.name) for s in streams]
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)


def _window(n: int) -> str:
    """A context's size as a user names it: "32K" (of 1,024 tokens), else the count ("the 5,000-token window")."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}-token"


def _length(session: Session, sources: SourceSet) -> tuple[str, int | None]:
    """The input's length as said before reading, with the tokens it is known to have at least (None: unknown):
    the count made before reading where there is one, else a guess from its size."""
    counted = session.counted
    if counted is not None:
        return (plural(counted.tokens, "token") if counted.complete else f"more than {counted.tokens:,} tokens"), counted.tokens
    guess = estimated_tokens(sources)  # what the session declares to the policy as reading starts
    if guess is not None:
        return f"about {guess:,} tokens", None
    return "length unknown (a stream)", None


def plan_line(session: Session, sources: SourceSet, resume: ReadPoint | None = None) -> str:
    """The one line said before reading, in a user's words: the model, what is read, its length, and how
    it is held ("qwen2.5-coder-1.5b · bash.txt · 7,906 tokens · fits the 32K window: reading it whole")."""
    what = _named(sources)
    if resume is not None:
        what = f"the rest of {what} from token {resume.next_position:,}"
    size, at_least = _length(session, sources)
    window = session.facts.n_ctx_train or session.engine.ctx.n_ctx
    if reads_in_full(session.settings.policy):
        if session.counted is not None and session.counted.complete:
            how = f"fits the {_window(window)} window: reading it whole"
        else:
            how = "reading it whole"
    else:
        memory = f"a {session.settings.budget:,}-cell memory ({session.policy_spec.partition(':')[0]})"
        if at_least is not None and at_least > window:
            how = f"past the {_window(window)} window: {memory}"
        elif session.counted is not None and session.counted.complete:
            how = f"within the {_window(window)} window, through {memory}"
        else:
            how = f"through {memory}"
    return " · ".join([session.model_name, what, size, how])


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
        err.print(escape(plan_line(session, sources, resume)), soft_wrap=True)
        if is_verbose():
            err.print(f"[bold]reading[/bold] {escape(what)} with {session.policy_spec}, budget "
                      f"{session.settings.budget:,} cells (context {session.engine.ctx.n_ctx:,}), prompt: "
                      f"{session.format.name}", soft_wrap=True)
        try:
            if err.is_terminal:
                _read_rich(session, sources, stop, resume)
            else:
                _read_plain(session, sources, stop, resume)
        except ReadingStopped:
            return _offer_to_keep(session, stop, save)
    _summary(session, sources)
    return True


def _exact_total(session: Session, resume: ReadPoint | None) -> int | None:
    """The input's tokens where they were counted whole before reading (a new read): the progress's total."""
    counted = session.counted
    return counted.tokens if resume is None and counted is not None and counted.complete else None


def _read_rich(session: Session, sources: SourceSet, stop: Interrupts, resume: ReadPoint | None) -> None:
    exact = _exact_total(session, resume)
    bounded = not reads_in_full(session.settings.policy)  # full attention holds everything: no pot to show
    columns = (TextColumn("[bold]reading"), BarColumn(), TextColumn("{task.completed:,}/{task.fields[est]} tokens"),
               _Rate(), *((TextColumn("pot {task.fields[cells]:,}/{task.fields[cap]:,}"),
                           TextColumn("{task.fields[comp]}")) if bounded else ()), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        # a continued read starts where it stopped (the rate is then of what this read reads)
        task = progress.add_task("read", total=exact, completed=session.doc_tokens if resume is not None else 0,
                                 est=f"{exact:,}" if exact else "?", cells=session.engine.n_cells,
                                 cap=session.engine.ctx.n_ctx, comp=plural(0, "compaction"))

        def on_progress(p: ReadProgress) -> None:
            total = exact or p.est_total
            progress.update(task, completed=p.tokens, total=total,
                            est=f"{exact:,}" if exact else f"~{p.est_total:,}" if p.est_total else "?",
                            cells=p.cells, comp=plural(p.compactions, "compaction"))
            if stop.hit:
                raise ReadingStopped

        session.read(sources, on_progress, resume=resume)


def _read_plain(session: Session, sources: SourceSet, stop: Interrupts, resume: ReadPoint | None) -> None:
    every = plain_every_s()
    t0 = last = time.perf_counter()
    before = session.doc_tokens if resume is not None else 0  # a continued read's rate is of what it reads
    exact = _exact_total(session, resume)
    bounded = not reads_in_full(session.settings.policy)

    def on_progress(p: ReadProgress) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= every:
            last = now
            of = f" of {exact:,}" if exact else f" of ~{p.est_total:,}" if p.est_total else ""
            pot = f", pot {p.cells:,}/{p.capacity:,} cells, {plural(p.compactions, 'compaction')}" if bounded else ""
            err.print(f"read {p.tokens:,}{of} tokens, {(p.tokens - before) / (now - t0):,.0f} tok/s{pot}", soft_wrap=True)
        if stop.hit:
            raise ReadingStopped

    session.read(sources, on_progress, resume=resume)


def _summary(session: Session, sources: SourceSet) -> None:
    st = session.stats()
    extra = f", {plural(sources.replaced, 'invalid UTF-8 sequence')} replaced" if sources.replaced else ""
    rate = f" ({st['read tok/s']:,} tok/s)" if "read tok/s" in st else ""
    n = st["document tokens"]
    what = plural(n, "token") if session.read_here == n else f"{session.read_here:,} more tokens ({n:,} in all)"
    # full attention bounds nothing: its cells are the tokens read, and it never compacts
    pot = (f"; pot {plural(st['tokens in pot'], 'cell')}, {plural(st['compactions'], 'compaction')}"
           if not reads_in_full(session.settings.policy) else "")
    err.print(f"read {what} in {session.read_seconds:.1f}s{rate}{pot}{extra}", soft_wrap=True)


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
