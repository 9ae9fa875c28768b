"""The one answering path every command shares (ask, chat, run, demo): settings from the options,
a Session opened or reopened, answers streamed to stdout, contexts saved. Terminal-facing; the
session itself (kvpot.session.session) knows nothing about terminals."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from kvpot.api.plan import estimated_tokens as _estimated_tokens  # noqa: F401 (the tests' name for it)
from kvpot.api.plan import plan_read, reopen, set_question
from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet
from kvpot.session.locating import HOW
from kvpot.session.sampling import Sampler
from kvpot.session.settings import reads_in_full, reads_with_question
from kvpot.wording import plural

from ._common import err, is_verbose, print_error, write_out
from ._interrupt import Interrupts
from .reading import QuestionProgress, plain_every_s, read_with_progress

if TYPE_CHECKING:  # opened by kvpot.api (plan_read → Plan.open, reopen), never assembled here
    from kvpot.session.session import Session

# said when chat reads through a pot that keeps what the question would have chosen, had it been known
# chat past the pot, on files (kvpot.api.Document.turn, cli/ask.py)
FOCUS_EACH_QUESTION = (
    "past what the pot keeps, each question finds its passages in the whole input ({how}) and reads them again "
    "with full attention before answering")
READ_BEFORE_THE_QUESTION = (
    "this reads before any question is asked, so the pot keeps what a summary of the input needs, not what "
    "your question will need: an answer about one detail may be what the model knows without the document. "
    "`/ask QUESTION` in the chat (or `kvpot ask FILE... QUESTION`) reads again with the question first and keeps "
    "what answers it (qwen2.5-coder-1.5b past its window: 6 of 8 answers right, against 2 of 8 read before the "
    "question; docs/benchmarks.md, Beyond the window)")


def new_session(inputs: list[str], glob: str | list[str], model: str, question: str | None,
                save_to: Path | str | None = None, exclude: list[str] | tuple = (), verbose: bool = False,
                resettable: bool | None = None, focus: bool = False, **opts) -> tuple[Session, SourceSet]:
    """A session for new inputs on the terminal: the reading planned by the API (kvpot.api.plan: every
    refusal before the model loads), what the plan gave said on stderr, the model loaded under a status line."""
    def notice(msg: str) -> None:
        err.print(f"[yellow]{escape(printable(msg))}[/yellow]", soft_wrap=True)

    plain_every_s()  # the environment's progress interval (KVPOT_PROGRESS_EVERY), checked before any reading
    plan = plan_read(inputs, model, question, glob=glob, exclude=exclude, save_to=save_to, resettable=resettable,
                     focus=focus, verbose=verbose, notice=notice, **opts)
    # what the inputs gave (the folders' summary, inputs skipped) is said once nothing is refused, so that
    # a refusal stays one line
    for msg in plan.notes:
        notice(msg)
    if plan.reason and is_verbose():  # the plan's reasons; the line before reading says what it comes to
        err.print(plan.reason, soft_wrap=True)
    settings, sources, expected = plan.settings, plan.sources, plan.expected_tokens
    if question is None and (expected is None or expected > settings.budget) and not reads_in_full(settings.policy):
        if settings.locator != "pot" and sources.can_read_again():
            err.print(FOCUS_EACH_QUESTION.format(how=HOW[settings.locator]), soft_wrap=True)
        elif reads_with_question(plan.policy):
            err.print(READ_BEFORE_THE_QUESTION, soft_wrap=True)
    with err.status(f"loading {plan.facts.name}"):
        session = plan.open()
    return session, sources


def reopen_session(context: str, model: str | None, threads: int | None, max_tokens: int | None = None,
                   save_to: Path | str | None = None, resettable: bool = True, go_on: bool = False) -> Session:
    """A saved context reopened (kvpot.api.plan.reopen), with what it holds said on stderr; `resettable`
    False for `ask`, which answers once (no copy kept for /reset); `go_on`: it is to read on (`--continue`)."""
    from kvpot.state.read_point import why_no_rest

    session = reopen(context, model, threads, max_tokens, save_to=save_to, resettable=resettable, go_on=go_on,
                     notice=lambda msg: err.print(f"[yellow]{escape(msg)}[/yellow]", soft_wrap=True),
                     loading=lambda: err.status(f"reopening {context}"))
    err.print(f"reopened {context}: {session.doc_tokens:,} tokens of "
              f"{', '.join(s['name'] for s in session.sources)} in {session.engine.n_cells:,} cells")
    stopped = session.read_stopped
    if stopped is not None and session.read_point is None:  # one with a point says --continue reads the rest
        err.print(f"[yellow]the input was read only partly:[/yellow] {escape(stopped.describe())} before the read "
                  f"stopped; {escape(why_no_rest(stopped, session.turns))}: answers know only that part",
                  soft_wrap=True)
    return session


def continue_reading(session: Session, context: Path | str, question: str | None, save_to: Path | str | None) -> None:
    """Read the rest of the inputs a reopened context stopped in (`--continue`), with the question as the
    catalyst when it is known, as `ask` reads; saved again when stopped, as a new read is."""
    from kvpot.state.read_point import reopen_sources

    point = session.read_point
    if point is None:
        from kvpot.state.read_point import cannot_continue

        raise KvpotError(cannot_continue(context, session.read_stopped, session.turns))
    notices = []
    sources = reopen_sources(point, notice=notices.append)
    if question:
        set_question(session, question)
    for msg in notices:
        err.print(f"[yellow]{escape(printable(msg))}[/yellow]", soft_wrap=True)
    read_with_progress(session, sources, save=None if save_to is None else lambda: save(session, save_to),
                       resume=point)


@dataclass(frozen=True)
class Answered:
    text: str        # what was written to stdout (without the closing newline)
    stopped: bool    # Ctrl-C ended it

    @property
    def empty(self) -> bool:
        return not self.text.strip()


def answer(session: Session, question: str, sampler: Sampler | None = None,
           stop_at: tuple[str, ...] = (), echo: bool = True) -> Answered:
    """Stream the answer to stdout (echo=False: only return it, for --json); Ctrl-C stops it. An empty
    answer is said on stderr (never a silent blank line), and so is an answer the loop guard ended."""
    said = ""
    t0 = time.perf_counter()
    progress = QuestionProgress()  # shown only when the question is read through the pot
    with Interrupts() as stop:
        try:
            pieces = session.ask(question, on_progress=progress.update, sampler=sampler, stop=stop_at)
            first = next(pieces, None)
        finally:
            progress.close()
        if session.conversation_dropped:
            err.print(f"[yellow]the context is full:[/yellow] its first tokens and the most recent stay, "
                      f"{session.conversation_dropped:,} cells between them make way for this turn "
                      f"(full attention turns into a StreamingLLM window)", soft_wrap=True)
        for piece in itertools.chain([] if first is None else [first], pieces):
            said += piece
            if echo:
                write_out(piece)
            if stop.hit:
                if echo:
                    write_out("\n")
                err.print("[yellow]answer stopped[/yellow]")
                return Answered(said, stopped=True)
    if echo:
        write_out("\n")
    if session.answer_loop:
        err.print(f"[yellow]answer stopped[/yellow] by {session.engine.stop_reason}", soft_wrap=True)
    done = Answered(said, stopped=False)
    if done.empty:
        err.print(f"[yellow]the model produced no answer[/yellow] (it ended at {session.engine.stop_reason})",
                  soft_wrap=True)
    else:
        err.print(f"answered in {time.perf_counter() - t0:.1f} s ({plural(session.engine.answer_tokens, 'token')})",
                  soft_wrap=True)
    return done


def save(session: Session, path: Path | str) -> bool:
    """Save the context; a failure is one line and the caller goes on (the answer, the chat)."""
    try:
        size = session.save(path)
    except KvpotError as e:
        print_error(str(e))
        return False
    err.print(f"context saved to {path} ({size / 2**20:,.1f} MiB)", soft_wrap=True)
    point = session.read_point
    if point is not None and session.turns == 0 and point.next_position == session.engine.tokens_seen:
        err.print(f"it holds the first {session.doc_tokens:,} tokens read; `kvpot ask --context {path} --continue "
                  f"QUESTION` (or `kvpot chat --context {path} --continue`) reads the rest of {point.names()}",
                  soft_wrap=True, markup=False)
    elif session.read_stopped is not None and session.read_stopped.stream:
        err.print(f"it holds the first {session.read_stopped.describe()}; the input was a "
                  "stream, which cannot be read again, so the rest can only be read with the whole input again",
                  soft_wrap=True, markup=False)
    return True
