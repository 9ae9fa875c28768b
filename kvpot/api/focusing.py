"""Past what the pot holds: the passages a question needs found in everything read (kvpot.session.locating) and
the session that reads them again with full attention (kvpot.session.focus), for `kvpot ask`, `kvpot chat`, the
API's Document and `kvpot serve`.

Nothing here writes to a terminal. What happens is said through `notice(kind, text)`: "pot" (the pot answers,
and why), "note" (the locator's own note) and "focus" (the passages found and where they lie); the slow parts
run inside `working(text)` (the terminal shows a status line) and the locating inside `locating(text)`, a
context manager that yields a `stop()` callable (the terminal's Ctrl-C)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.locator.sources import top_passages
from kvpot.session.focus import READ_ONCE, FocusText, Located, focus_for, why_not
from kvpot.session.locating import HOW, locate_with, locator_for
from kvpot.session.session import Session

Notice = Callable[[str, str], None]
Working = Callable[[str], AbstractContextManager]
Locating = Callable[[str], AbstractContextManager[Callable[[], bool]]]

# said when the input was read through a pot from a pipe: the passages cannot be read again
FROM_A_PIPE = ("the answer comes from the pot: {why}, so the passages its answer draws on cannot be read again with "
               "full attention (pass files to have them read again)")


def quiet(kind: str, text: str) -> None:
    """The API's default notice: nothing said."""


@contextmanager
def no_status(text: str) -> Iterator[None]:
    yield


@contextmanager
def never_stopped(text: str) -> Iterator[Callable[[], bool]]:
    yield lambda: False


class Focus:
    """What the pot's reading found for the focused read: its input and settings, and the pot reading's figures
    for --json."""

    def __init__(self, text: FocusText, settings, located: Located, pot: dict, passages: list[dict] | None = None):
        self.text, self.settings, self.located, self.pot = text, settings, located, pot
        # the passages located, best first, as `--sources` names them (kvpot.locator.sources.top_passages: the
        # same ranking, lines and offsets); the windows read again are these, widened
        self.passages = passages or []

    def places(self) -> str:
        """"notes.txt line 40, line 1,210; log.txt line 3": where each passage starts, by file, best first."""
        by: dict[str, list[str]] = {}
        for p in self.passages or [{"source": w.source, "where": w.where} for w in self.text.windows]:
            by.setdefault(p["source"], []).append(p["where"] or "?")
        return "; ".join(f"{src} {', '.join(wheres)}".strip() for src, wheres in by.items())


def find_passages(session: Session, question: str, extra_tokens: int = 0, locator: str | None = None,
                  notice: Notice = quiet, locating: Locating = never_stopped) -> Focus | None:
    """The focused read's input, or None where the answer comes from the pot (nothing was left out; a pipe; the
    locator routes the question there; the passages cannot be read again or cannot fit), said through `notice`.
    The passages are located as the session's locator says (`locator`: this one rather than the session's);
    `extra_tokens`: read after the passages besides the question (a chat's conversation so far). Raises
    KeyboardInterrupt when `locating`'s stop() ended the locating."""
    why = why_not(session)
    if why is not None:
        if why == READ_ONCE:
            notice("plain", FROM_A_PIPE.format(why=why))
        return None
    name, note = locator_for(session) if locator is None else (locator, "")
    if note:
        notice("note", note)
    try:
        with locating(f"finding the passages the question needs ({HOW[name]})") as stop:
            located = locate_with(name, session, question, stop=stop)
    except KvpotError as e:  # no passage found, or a question about the whole input (locating.route)
        notice("pot", printable(str(e)))
        return None
    if located.stopped:
        raise KeyboardInterrupt
    if extra_tokens:
        located = Located(located.answer, located.mass, located.question_tokens + extra_tokens, located.stopped,
                          located.locator)
    try:
        text, settings = focus_for(session, located)
    except KvpotError as e:
        notice("pot", printable(str(e)))
        return None
    # named as --sources names them; read now, while the pot's session can map its stream positions
    passages = [p.as_dict() for p in top_passages(session, text.ranked, mass=located.mass)]
    st = session.engine.stats()
    pot = {"policy": session.policy_spec, "budget": session.settings.budget, "tokens_read": session.doc_tokens,
           "cells": st.n_cells_used, "compactions": st.n_compactions, "read_seconds": round(session.read_seconds, 3),
           "inputs": [s["name"] for s in session.sources],
           "question_before": session.settings.question_before == "on"}
    return Focus(text, settings, located, pot, passages)


def focus_line(focus: Focus) -> str:
    """What the focused read says before it reads: the passages located (as `--sources` numbers them) and,
    where overlapping ones were joined, the stretches of text that hold them, so the focused read's own
    line (one input of joined passages) does not seem to contradict the count."""
    n, w = len(focus.passages) or len(focus.text.windows), len(focus.text.windows)
    joined = f" (overlapping ones joined: {w} stretch{'es' if w != 1 else ''} of text)" if w < n else ""
    return (f"{n} passage{'s' if n != 1 else ''} found ({HOW[focus.located.locator]}), read again with full "
            f"attention{joined}: {printable(focus.places())}")


def open_focused(focus: Focus, facts, model_name: str, notice: Notice = quiet, working: Working = no_status) -> Session:
    """The session that reads the passages with full attention (the pot's session already closed or suspended)."""
    notice("focus", focus_line(focus))
    with working(f"loading {facts.name}"):
        session = Session(facts, model_name, focus.settings, resettable=False)
    session.counted = focus.text.counted  # the passages' tokens, counted when their read was planned
    return session


def focus_report(focus: Focus, session: Session) -> dict:
    """--json: the pot's reading as the answer's reading, and the focused read beside it."""
    p = focus.pot
    return {"policy": p["policy"], "budget": p["budget"], "tokens_read": p["tokens_read"], "cells": p["cells"],
            "compactions": p["compactions"], "question_before": p["question_before"],
            "focus": {"passages": [{"source": w.source, "where": w.where, "start": w.start, "end": w.end}
                                   for w in focus.text.windows],
                      # the passages located, best first, named as --sources names them
                      "located": focus.passages,
                      "tokens_read": session.doc_tokens, "read_seconds": round(session.read_seconds, 3),
                      "pot_answer": focus.located.answer}}
