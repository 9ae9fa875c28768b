"""Answering from a read document: the answer as a value (`Answer`), and the turn that answers past what
the pot holds as `kvpot ask` and `kvpot chat` do: the question's passages located in everything read, read
again with full attention in a session of their own, and answered there (kvpot.session.focus,
kvpot.session.locating). The terminal's answering (streamed to stdout, --json) and the API's (a value) share
this turn; each passes its own way of answering in a session and of reading the passages."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kvpot.api.focusing import Locating, Notice, Working, find_passages, never_stopped, no_status, open_focused, quiet
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet
from kvpot.locator.sources import top_passages
from kvpot.session.sampling import Sampler
from kvpot.session.session import Session


@dataclass(frozen=True)
class Answer:
    """One answer: its text, the passages it drew on most (asked for with sources=True; each a dict with
    the source's name, the place in it and a quote, as `--sources` prints them), why it ended
    (end-of-generation, max-tokens, context-full, stop-string, end-of-line, loop-guard), how long answering
    took, and the tokens it holds. `focus`: where the answer came from a focused read, what it read."""

    text: str
    sources: list[dict] = field(default_factory=list)
    stop_reason: str = ""
    seconds: float = 0.0
    tokens: int = 0
    focus: dict | None = None


class Said(Protocol):
    text: str


R = TypeVar("R", bound=Said)


def check_question(question) -> str:
    """A question is non-empty text a tokenizer takes (UTF-8): said before anything is read or located."""
    if not isinstance(question, str):
        raise KvpotError(f"a question is text, got {type(question).__name__}")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        raise KvpotError("the question is not valid UTF-8 text") from None
    if not question.strip():
        raise KvpotError("the question is empty")
    return question


def answer_in(session: Session, question: str, sampler: Sampler | None = None, stop: tuple[str, ...] = (),
              max_tokens: int | None = None, sources: bool = False,
              on_text: Callable[[str], object] | None = None) -> Answer:
    """Answer `question` in `session` (the exchange stays in its pot); `on_text` hears each piece as it comes;
    `sources`: every answer token is tapped for the passages it drew on (that costs decode time)."""
    if sources:
        session.engine.track_answer_attention(True)
    t0 = time.perf_counter()
    text = ""
    try:
        for piece in session.ask(question, max_tokens=max_tokens, sampler=sampler or Sampler(), stop=stop):
            text += piece
            if on_text is not None:
                on_text(piece)
        found = [p.as_dict() for p in top_passages(session)] if sources else []
    finally:
        if sources:
            session.engine.track_answer_attention(False)
    eng = session.engine
    return Answer(text.strip(), found, eng.stop_kind, time.perf_counter() - t0, eng.answer_tokens)


def conversation_tokens(session: Session, history: list[tuple[str, str]]) -> int:
    """The tokens the conversation so far takes after the passages of a focused read."""
    return sum(len(session._tokens(session.format.follow_up(q))) + len(session.engine.model.tokenize(a))
               for q, a in history)


def past_the_pot(session: Session, question: str, answer: Callable[[Session, object], R],
                 read: Callable[[Session, SourceSet], object], locator: str | None = None,
                 history: list[tuple[str, str]] = (), keep: bool = True, notice: Notice = quiet,
                 working: Working = no_status, locating: Locating = never_stopped) -> R:
    """Answer `question` from the document `session` read: where the pot left part of an input that can be
    read again out, the passages the question needs are located (`locator`, else the session's:
    kvpot.session.locating), the pot's session is suspended (`keep`: loaded again afterwards with the
    exchange added, so follow-ups and a save have it) or closed, and the passages are read with full
    attention (`read(session, text)`) in a session of their own, the conversation so far (`history`) after
    them, where `answer(session, found)` answers; else `answer(session, None)` answers from the pot.
    `keep` False: the pot's session is closed by the time this returns, whichever way it ends.
    `notice`, `working`, `locating`: what is said and shown while it works (kvpot.api.focusing; the terminal's
    are cli/_focus.ON_TERMINAL)."""
    located = False
    try:
        extra = conversation_tokens(session, history) if history else 0
        found = find_passages(session, question, extra_tokens=extra, locator=locator, notice=notice,
                              locating=locating)
        located = found is not None
        if not located:
            return answer(session, None)
    finally:
        if not keep and not located:  # answered from the pot, or stopped: closed here
            session.close()
    facts, name = session.facts, session.model_name
    if keep:
        session.suspend()
    else:
        session.close()  # the two sessions never share the device's memory
    try:
        with open_focused(found, facts, name, notice, working) as focused:
            read(focused, found.text)
            for q, a in history:
                focused.add_exchange(q, a)
            said = answer(focused, found)
    finally:
        if keep:
            with working(f"loading {facts.name} and the pot again"):
                session.resume()
    if keep:
        session.add_exchange(question, said.text)
    return said
