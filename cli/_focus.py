"""The focused read past the pot (kvpot.api.focusing) on the terminal: what it finds said on stderr, the
locating under a status line that Ctrl-C stops, and chat's turn past the pot streamed as any answer is."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.markup import escape

from kvpot.api import focusing
from kvpot.api.answering import past_the_pot
from kvpot.api.focusing import Focus, focus_report  # noqa: F401  (ask's --json report)
from kvpot.session.locating import locator_for
from kvpot.session.session import Session

from ._common import err
from ._interrupt import Interrupts
from ._report import answer_tracked
from .reading import read_with_progress


def terminal_notice(kind: str, text: str) -> None:
    if kind == "focus":
        err.print(f"[bold]focus:[/bold] {escape(text)}", soft_wrap=True)
    elif kind == "pot":
        err.print(f"[yellow]the answer comes from the pot:[/yellow] {escape(text)}", soft_wrap=True)
    elif kind == "note":
        err.print(f"[yellow]{escape(text)}[/yellow]", soft_wrap=True)
    else:
        err.print(text, soft_wrap=True, markup=False)


@contextmanager
def terminal_locating(text: str) -> Iterator[Callable[[], bool]]:
    """A status line while the passages are found; a first Ctrl-C stops the finding (the question is dropped)."""
    with Interrupts() as stop, err.status(text):
        yield lambda: stop.hit


# how the terminal's ask and chat hear and show a focused read (kvpot.api.answering.past_the_pot's keywords)
ON_TERMINAL = dict(notice=terminal_notice, working=err.status, locating=terminal_locating)


def find_passages(session: Session, question: str, extra_tokens: int = 0, locator: str | None = None) -> Focus | None:
    """kvpot.api.focusing.find_passages, said on the terminal."""
    return focusing.find_passages(session, question, extra_tokens, locator, notice=terminal_notice,
                                  locating=terminal_locating)


def focused_turn(session: Session, question: str, history: list[tuple[str, str]], sampler, stop_at: tuple[str, ...],
                 want_sources: bool):
    """A chat question past what the pot holds (kvpot.api.answering.past_the_pot with the pot's session kept):
    (what was said, the passages the answer drew on: ranked by its own attention with `want_sources`, else the
    passages read again for it, each marked `read_for_the_answer`), or None where the pot answers (nothing left
    out, inputs that cannot be read again, a question routed to the pot, a locator that needs the pot's own
    answer: that answer would stay in the conversation)."""
    if locator_for(session)[0] == "pot":
        return None
    passages = None

    def answer(focused: Session, found: Focus | None):
        nonlocal passages
        if found is None:
            return None  # the chat answers from the pot itself
        said, _, got = answer_tracked(focused, question, sampler, stop_at, True, want_sources)
        passages = got if got is not None else [dict(p, read_for_the_answer=True) for p in found.passages]
        return said

    said = past_the_pot(session, question, answer, read_with_progress, history=history, keep=True, **ON_TERMINAL)
    return None if said is None else (said, passages)
