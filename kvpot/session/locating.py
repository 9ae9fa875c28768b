"""Where, in everything read, the passages a question needs lie: the locators a focused read (kvpot.session.focus)
can take its passages from, by the name `--locator` (RunSettings.locator) gives.

- keys: the read-once locator (kvpot.locator.keys): the question's own lookup queries score the representative
  key kept for every block of the input during the read, whatever the pot kept of it. No answer is generated.
- pot: the pot answers the question (not shown) and the attention that answer paid to the document locates
  (focus.locate). It sees only what the pot kept, so past the window it locates what survived the reading.

Each returns a `Located`: the attention-like mass per stream position that the focused read ranks into passages
(kvpot.session.sources.passages_in), so every locator feeds the same windows, numbering and `--sources`.
"""

from __future__ import annotations

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.keys import ANGLE
from kvpot.session.focus import PASSAGES, Located, locate
from kvpot.session.sources import PASSAGE_TOKENS

# how each locator is said on stderr ("finding the passages the question needs (...)")
HOW = {"keys": "by the locator keys kept while reading", "pot": "by the pot's own answer's attention",
       "bm25": "by keyword ranking (BM25)", "mix": "by the locator keys and keyword ranking together"}

# blocks given mass: twice the passages a focused read takes, so a block that falls in a heading or past the
# inputs' text (the ranking skips those) leaves others to take its place
BLOCKS = 2 * PASSAGES


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


def block_mass(session, question: str, weights: np.ndarray | None = None) -> dict[int, float]:
    """The keys locator's mass: the BLOCKS best blocks for the question, each as its score above the first block
    left out, on the middle PASSAGE_TOKENS positions of the block (so the ranking takes one passage per block)."""
    eng = session.engine
    keys = eng.block_keys
    if keys is None or keys.n_blocks == 0:
        raise KvpotError("this reading kept no locator keys (a context saved by an older kvpot, or full attention)")
    toks, capture = question_tokens(session, question)
    query = eng.question_queries(toks, capture, ANGLE)
    if query is None:
        raise KvpotError("the pot has no room left to read the question for locating")
    score = keys.scores(query, weights)
    spans = keys.spans()
    order = np.argsort(-score, kind="stable")
    top = order[:BLOCKS]
    floor = float(score[order[BLOCKS]]) if order.size > BLOCKS else float(score.min()) - 1.0
    mass: dict[int, float] = {}
    for b in top.tolist():
        lo, hi = int(spans[b, 0]), int(spans[b, 1])
        mid = (lo + hi) // 2
        a, z = max(lo, mid - PASSAGE_TOKENS // 2), min(hi, mid - PASSAGE_TOKENS // 2 + PASSAGE_TOKENS)
        w = (float(score[b]) - floor + 1e-6) / max(1, z - a)
        for p in range(a, z):
            mass[p] = w
    return mass


def locator_for(session) -> tuple[str, str]:
    """The locator the session's settings name, and a note where it cannot run and another one does: a context
    saved without locator keys (by an older kvpot) locates by the pot."""
    name = session.settings.locator
    if name in ("keys", "mix") and session.engine.block_keys is None:
        return "pot", "this context holds no locator keys (saved by an older kvpot): the pot's answer locates"
    return name, ""


def locate_with(name: str, session, question: str, stop=lambda: False) -> Located:
    """The passages' mass for `question` by the locator `name` (RunSettings.locator's choices)."""
    if name == "pot":
        return locate(session, question, stop=stop)
    asked = len(session._tokens(session.format.first_question(question)))
    if name == "keys":
        return Located("", block_mass(session, question), asked, locator="keys")
    if name == "bm25":  # kvpot.locator.lexical
        from kvpot.locator.lexical import bm25_mass
        return Located("", bm25_mass(session, question, BLOCKS), asked, locator="bm25")
    if name == "mix":  # kvpot.locator.mix
        from kvpot.locator.mix import mix_mass
        return Located("", mix_mass(session, question, BLOCKS), asked, locator="mix")
    raise KvpotError(f"unknown locator {name!r}")
