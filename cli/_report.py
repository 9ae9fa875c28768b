"""What ask, run and chat print after reading: the answer, `--sources` (the passages it drew on) and, for
ask and run, `--json` (one JSON object on stdout for scripts, instead of the streamed answer).

Errors under --json are JSON too (cli/_common.errors_as_json); progress and notices stay on stderr as text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from kvpot.display import printable
from kvpot.locator.sources import format_passages, top_passages
from kvpot.session.sampling import Sampler

from ._common import elapsed, write_out
from ._session import Answered, answer

if TYPE_CHECKING:
    from kvpot.session.session import Session

# the options ask and run share (chat takes --sources too)
JsonOpt = Annotated[bool, typer.Option(
    "--json", help="the answer as one JSON object, errors too")]
SourcesOpt = Annotated[bool, typer.Option(
    "--sources", help="then the passages the answer drew on most")]


def report(session: Session, said: Answered, answer_seconds: float, context: str | None = None,
           sources: list[dict] | None = None) -> dict:
    """What a script needs of one answer: the text, where it came from, what was read and skipped,
    and what it cost. `sources` is present only when asked for (--sources taps every answer token)."""
    st = session.engine.stats()
    read = session.source_set
    out = {
        "answer": said.text.strip(),
        "stopped": said.stopped,
        # by name: end-of-generation, max-tokens, context-full, stop-string, end-of-line, loop-guard, interrupted
        "stop_reason": "interrupted" if said.stopped else session.engine.stop_kind,
        "model": session.model_name,
        "policy": session.policy_spec,
        "budget": session.settings.budget,
        # the question was put before the document too (--question-before); a reopened context: as it was read
        "question_before": session.settings.question_before == "on",
        "context": context,
        "inputs": {"read": [s["name"] for s in session.sources],
                   "skipped": [{"path": p, "why": why} for p, why in (read.left_out if read else [])],
                   # what was left out while reading (a PDF's damaged page), as said on stderr
                   "warnings": list(read.warnings) if read else []},
        "tokens_read": session.doc_tokens,
        "cells": st.n_cells_used,
        "compactions": st.n_compactions,
        "answer_tokens": session.engine.answer_tokens,
        "seconds": {"read": round(session.read_seconds, 3), "answer": round(answer_seconds, 3),
                    "total": round(elapsed(), 3)},
    }
    if sources is not None:
        out["sources"] = sources
    return out


def sources_text(found: list[dict]) -> str:
    """--sources as printed on the terminal: each passage's file name, place and quote with their control
    characters shown as escapes (kvpot.display), so that a name or a document cannot drive the terminal or
    forge a line (the JSON report escapes them itself)."""
    safe = [{k: printable(v) if isinstance(v, str) else v for k, v in p.items()} for p in found]
    return format_passages(safe)


def print_report(obj: dict) -> None:
    write_out(json.dumps(obj, ensure_ascii=False) + "\n")


def answer_tracked(session: Session, question: str, sampler: Sampler | None, stop_at: tuple[str, ...],
                   echo: bool, want_sources: bool) -> tuple[Answered, float, list[dict] | None]:
    """Answer (streamed to stdout when `echo`), with the passages it drew on when `want_sources`
    (every answer token is tapped for them); (what was said, seconds, the passages or None)."""
    if want_sources:
        session.engine.track_answer_attention(True)
    try:
        t0 = time.perf_counter()
        said = answer(session, question, sampler, stop_at, echo=echo)
        seconds = time.perf_counter() - t0
        found = [p.as_dict() for p in top_passages(session)] if want_sources else None
    finally:
        if want_sources:
            session.engine.track_answer_attention(False)
    return said, seconds, found


def answer_with_sources(session: Session, question: str, sampler: Sampler | None, stop_at: tuple[str, ...],
                        json_out: bool, want_sources: bool, context: str | None = None,
                        amend: Callable[[dict], None] | None = None) -> Answered:
    """Answer as ask and run do, then the passages it drew on (--sources) and the JSON object (--json),
    changed by `amend` before it is printed (ask's focused read reports the pot's reading too)."""
    said, seconds, found = answer_tracked(session, question, sampler, stop_at, not json_out, want_sources)
    if json_out:
        obj = report(session, said, seconds, context, found)
        if amend is not None:
            amend(obj)
        print_report(obj)
    elif found is not None and not said.stopped:
        write_out(sources_text(found))
    return said
