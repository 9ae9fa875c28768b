"""The keys locator's question: the tokens of the turn that would ask it, and its lookup queries against every
block's representative keys (kvpot.locator.keys), read after the pot as that turn would be read."""

from __future__ import annotations

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.keys import ANGLE


def question_tokens(session, question: str) -> tuple[list[int], tuple[int, int]]:
    """The tokens of the turn that would ask `question` (the first question or a follow-up, as Session.ask puts
    it), up to the question's end, and [start, end) of the question's own tokens in them: the lookup query is
    the question's, not the template's markup (whose rows are alike for every question)."""
    q = question.strip()
    if not q:
        raise KvpotError("the question is empty")
    fmt = session.format
    segs = fmt.first_question(q) if session.turns == 0 else fmt.follow_up(q)
    tok = session.engine.model.tokenize
    out: list[int] = []
    for seg in segs:
        at = -1 if seg.special else seg.text.rfind(q)
        if at < 0:
            out += tok(seg.text, special=seg.special)
            continue
        out += tok(seg.text[:at]) if at else []
        a = len(out)
        out += tok(q)
        return out, (a, len(out))
    raise KvpotError("internal: the question is not in the turn that asks it")


def block_scores(session, question: str, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the blocks' [n, 2] stream spans, their [n] scores) for `question` by the keys locator: the question's
    lookup queries against every block's representative keys, heads weighed by `weights` [L, H] (None: alike;
    kvpot.session.locating.block_mass gives them mass)."""
    eng = session.engine
    keys = eng.block_keys
    if keys is None or keys.n_blocks == 0:
        raise KvpotError("this reading kept no locator keys (a context saved by an older kvpot, or full attention)")
    toks, capture = question_tokens(session, question)
    query = eng.question_queries(toks, capture, ANGLE)
    if query is None:
        raise KvpotError("the pot has no room left to read the question for locating")
    return keys.spans(), keys.scores(query, weights)
