"""Where, in everything read, the passages a question needs lie: the locators a focused read (kvpot.session.focus)
can take its passages from, by the name `--locator` (RunSettings.locator) gives.

- keys: the read-once locator (kvpot.locator.keys): the question's own lookup queries score the representative
  key kept for every block of the input during the read, whatever the pot kept of it. No answer is generated.
- pot: the pot answers the question (not shown) and the attention that answer paid to the document locates
  (focus.locate). It sees only what the pot kept, so past the window it locates what survived the reading.

- bm25, mix: the input's passages ranked by the question's words (kvpot.locator.lexical), with the keys' ranking
  fused in for mix (kvpot.locator.mix).

Before the lexical locators rank, `route` sends a question whose words single out no passage (a question about the
whole input, "what is this file about?") to the pot, which read all of it: `PotAnswers`, said as any other case
where the pot answers.

Each returns a `Located`: the attention-like mass per stream position that the focused read ranks into passages
(kvpot.locator.sources.passages_in), so every locator feeds the same windows, numbering and `--sources`.
"""

from __future__ import annotations

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.lexical import FLAT, bm25_mass, index_for
from kvpot.locator.mix import mix_mass
from kvpot.locator.query import block_scores
from kvpot.locator.sources import PASSAGE_TOKENS
from kvpot.session.focus import PASSAGES, Located, locate

# how each locator is said on stderr ("finding the passages the question needs (...)")
HOW = {"keys": "by the locator keys kept while reading", "pot": "by the pot's own answer's attention",
       "bm25": "by keyword ranking, BM25", "mix": "by the locator keys and keyword ranking together"}

# blocks given mass: twice the passages a focused read takes, so a block that falls in a heading or past the
# inputs' text (the ranking skips those) leaves others to take its place
BLOCKS = 2 * PASSAGES


def block_mass(session, question: str, weights: np.ndarray | None = None) -> dict[int, float]:
    """The keys locator's mass: the BLOCKS best blocks for the question, each as its score above the first block
    left out, on the middle PASSAGE_TOKENS positions of the block (so the ranking takes one passage per block)."""
    spans, score = block_scores(session, question, weights)
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


class PotAnswers(KvpotError):
    """The question is for the pot, not a focused read: raised by `locate_with`, caught where the pot answers."""


def route(name: str, session, question: str) -> str | None:
    """Why the pot answers `question` rather than a focused read, or None. Only the lexical locators route (bm25,
    mix: by BM25's ranking, `LexicalIndex.peak` under FLAT); the keys' and the pot's rankings have no measured
    threshold."""
    if name not in ("bm25", "mix"):
        return None
    peak = index_for(session).peak(question)
    if peak == 0.0:  # mix still has the keys' ranking
        return "no word of the question is in the input" if name == "bm25" else None
    if peak < FLAT:
        return (f"the question's words single out no passage (the best scores {peak:.1f}x the mean of those holding "
                f"them): it is taken as a question about the whole input")
    return None


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
    why = route(name, session, question)
    if why is not None:
        raise PotAnswers(why)
    asked = len(session._tokens(session.format.first_question(question)))
    if name == "keys":
        return Located("", block_mass(session, question), asked, locator="keys")
    if name == "bm25":  # kvpot.locator.lexical
        return Located("", bm25_mass(session, question, BLOCKS), asked, locator="bm25")
    if name == "mix":  # kvpot.locator.mix
        return Located("", mix_mass(session, question, BLOCKS), asked, locator="mix")
    raise KvpotError(f"unknown locator {name!r}")
