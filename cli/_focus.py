"""`kvpot ask`'s focused read (kvpot.session.focus) on the terminal: the locating answer under a status line,
the passages found said on stderr, the pot's session closed before the focused one loads (the two never
share the device's memory), and the focused read shown as any read is."""

from __future__ import annotations

from rich.markup import escape

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.session.focus import READ_ONCE, FocusText, Located, focus_for, why_not
from kvpot.session.locating import HOW, locate_with, locator_for
from kvpot.session.session import Session
from kvpot.session.sources import top_passages

from ._common import err
from ._interrupt import Interrupts
from ._report import answer_tracked
from .reading import read_with_progress

# said when the input was read through a pot from a pipe: the passages cannot be read again
FROM_A_PIPE = ("the answer comes from the pot: {why}, so the passages its answer draws on cannot be read again with "
               "full attention (pass files to have them read again)")


class Focus:
    """What the pot's reading found for the focused read: its input and settings, and the pot reading's figures
    for --json."""

    def __init__(self, text: FocusText, settings, located: Located, pot: dict, passages: list[dict] | None = None):
        self.text, self.settings, self.located, self.pot = text, settings, located, pot
        # the passages the pot's answer drew on, best first, as `--sources` names them (kvpot.session.sources.
        # top_passages: the same ranking, lines and offsets); the windows read again are these, widened
        self.passages = passages or []

    def places(self) -> str:
        """"notes.txt line 40, line 1,210; log.txt line 3": where each passage starts, by file, best first."""
        by: dict[str, list[str]] = {}
        for p in self.passages or [{"source": w.source, "where": w.where} for w in self.text.windows]:
            by.setdefault(p["source"], []).append(p["where"] or "?")
        return "; ".join(f"{src} {', '.join(wheres)}".strip() for src, wheres in by.items())


def find_passages(session: Session, question: str, extra_tokens: int = 0, locator: str | None = None) -> Focus | None:
    """The focused read's input, or None where the answer comes from the pot (nothing was left out; a pipe;
    the passages cannot be read again or cannot fit). The passages are located as the session's locator says
    (kvpot.session.locating). `extra_tokens`: read after the passages besides the question (chat's conversation
    so far); `locator`: this one rather than the session's. Raises KeyboardInterrupt when Ctrl-C stops it."""
    why = why_not(session)
    if why is not None:
        if why == READ_ONCE:
            err.print(FROM_A_PIPE.format(why=why), soft_wrap=True)
        return None
    name, note = locator_for(session) if locator is None else (locator, "")
    if note:
        err.print(f"[yellow]{escape(note)}[/yellow]", soft_wrap=True)
    try:
        with Interrupts() as stop, err.status(f"finding the passages the question needs ({HOW[name]})"):
            located = locate_with(name, session, question, stop=lambda: stop.hit)
    except KvpotError as e:  # no passage found, or a question about the whole input (locating.route): the pot answers
        err.print(f"[yellow]the answer comes from the pot:[/yellow] {escape(printable(str(e)))}", soft_wrap=True)
        return None
    if located.stopped:
        raise KeyboardInterrupt
    if extra_tokens:
        located = Located(located.answer, located.mass, located.question_tokens + extra_tokens, located.stopped,
                          located.locator)
    try:
        text, settings = focus_for(session, located)
    except KvpotError as e:
        err.print(f"[yellow]the answer comes from the pot:[/yellow] {escape(printable(str(e)))}", soft_wrap=True)
        return None
    # named as --sources names them; read now, while the pot's session can map its stream positions
    passages = [p.as_dict() for p in top_passages(session, text.ranked, mass=located.mass)]
    st = session.engine.stats()
    pot = {"policy": session.policy_spec, "budget": session.settings.budget, "tokens_read": session.doc_tokens,
           "cells": st.n_cells_used, "compactions": st.n_compactions, "read_seconds": round(session.read_seconds, 3),
           "inputs": [s["name"] for s in session.sources],
           "question_before": session.settings.question_before == "on"}
    return Focus(text, settings, located, pot, passages)


def focused_session(focus: Focus, facts, model_name: str) -> Session:
    """The session that reads the passages with full attention (the pot's session already closed)."""
    n = len(focus.passages) or len(focus.text.windows)
    err.print(f"[bold]focus:[/bold] {n} passage{'s' if n != 1 else ''} found ({HOW[focus.located.locator]}), read again "
              f"with full attention: {escape(focus.places())}", soft_wrap=True)
    with err.status(f"loading {facts.name}"):
        return Session(facts, model_name, focus.settings, resettable=False)


def focus_report(focus: Focus, session: Session) -> dict:
    """--json: the pot's reading as the answer's reading, and the focused read beside it."""
    p = focus.pot
    return {"policy": p["policy"], "budget": p["budget"], "tokens_read": p["tokens_read"], "cells": p["cells"],
            "compactions": p["compactions"], "question_before": p["question_before"],
            "focus": {"passages": [{"source": w.source, "where": w.where, "start": w.start, "end": w.end}
                                   for w in focus.text.windows],
                      # the passages the pot's answer drew on most, best first, named as --sources names them
                      "located": focus.passages,
                      "tokens_read": session.doc_tokens, "read_seconds": round(session.read_seconds, 3),
                      "pot_answer": focus.located.answer}}


def focused_turn(session: Session, question: str, history: list[tuple[str, str]], sampler, stop_at: tuple[str, ...],
                 want_sources: bool):
    """A chat question past what the pot holds: its passages located (the session's locator), the pot's session
    suspended (its model and cache freed, its state kept), the passages read with full attention in a session of
    their own with the conversation so far after them, and the question answered there; then the pot's session
    loaded again with the exchange added, so follow-ups and /save have it. (what was said, the passages the answer
    drew on: ranked by its own attention with `want_sources`, else the passages read again for it, each marked
    `read_for_the_answer`), or None where the pot answers (nothing left out, inputs that cannot be read again, a
    locator that needs the pot's own answer)."""
    if locator_for(session)[0] == "pot":  # the pot's locating answer would stay in the conversation
        return None
    extra = sum(len(session._tokens(session.format.follow_up(q))) + len(session.engine.model.tokenize(a))
                for q, a in history)
    found = find_passages(session, question, extra_tokens=extra)
    if found is None:
        return None
    facts, name = session.facts, session.model_name
    session.suspend()
    try:
        with focused_session(found, facts, name) as focused:
            read_with_progress(focused, found.text)
            for q, a in history:
                focused.add_exchange(q, a)
            said, _, passages = answer_tracked(focused, question, sampler, stop_at, True, want_sources)
    finally:
        with err.status(f"loading {facts.name} and the pot again"):
            session.resume()
    session.add_exchange(question, said.text)
    # without --sources the answer's own attention was not tapped: /sources names the passages it was read from
    return said, passages if passages is not None else [dict(p, read_for_the_answer=True) for p in found.passages]
