"""The focused read past the pot (kvpot.api.focusing) on the terminal: what it finds said on stderr, the
locating under a status line that Ctrl-C stops (ask's and chat's turns pass ON_TERMINAL to the API's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.markup import escape

from kvpot.api import focusing
from kvpot.api.focusing import Focus, focus_report  # noqa: F401  (ask's --json report)

from ._common import err
from ._interrupt import Interrupts

if TYPE_CHECKING:
    from kvpot.session.session import Session


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
