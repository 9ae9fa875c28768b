"""The combined locator (`--locator mix`), and every locator's ranking as spans of stream positions (what
`kvpot bench locate` scores, beside the mass the focused read takes).

mix fuses two rankings by reciprocal rank (Cormack et al. 2009: each item scores the sum of 1 / (RRF_K + its
rank) over the rankings that hold it; RRF_K = 60, their constant): the lexical locator's passages
(kvpot.locator.lexical, BM25) and the keys locator's blocks (kvpot.locator.keys), mapped onto those passages
(a passage ranks where the best block overlapping it ranks among the passages). Ranks rather than scores: BM25's
scores and the keys' standardised dot products have no common scale. The fused passages give mass as the
lexical locator's do (`lexical.spread`), so the focused read works unchanged.
"""

from __future__ import annotations

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.lexical import LINES, index_for, spread
from kvpot.locator.query import block_scores
from kvpot.locator.sources import rank

RRF_K = 60
TOP_RANKED = 64   # passages of the pot's ranking listed (`ranked_spans`): its mass names few more


def keys_ranked(session, question: str) -> list[tuple[int, int, float]]:
    """(first stream position, end, score) of every block, best first."""
    spans, score = block_scores(session, question)
    order = np.argsort(-score, kind="stable")
    return [(int(spans[b, 0]), int(spans[b, 1]), float(score[b])) for b in order.tolist()]


def passage_ranks(passages: np.ndarray, blocks: np.ndarray, score: np.ndarray) -> np.ndarray:
    """[n passages] float: each passage's rank (1 = best) by the best score of the blocks overlapping it
    (stream spans [n, 2] each); inf for a passage no block overlaps."""
    best = np.full(passages.shape[0], -np.inf)
    starts = passages[:, 0]
    for (b0, b1), s in zip(blocks.tolist(), score.tolist()):
        i = max(int(np.searchsorted(starts, b0, side="right")) - 1, 0)
        while i < passages.shape[0] and passages[i, 0] < b1:
            if passages[i, 1] > b0 and s > best[i]:
                best[i] = s
            i += 1
    ranks = np.full(passages.shape[0], np.inf)
    held = np.flatnonzero(np.isfinite(best))
    order = held[np.argsort(-best[held], kind="stable")]
    ranks[order] = np.arange(1, order.size + 1)
    return ranks


def mix_ranked(session, question: str, lines: int = LINES) -> list[tuple[int, int, float]]:
    """(first stream position, end, fused score) of the input's passages (`lexical.cut`), best first; those in
    neither ranking (no word of the question, no block) left out."""
    idx = index_for(session, lines)
    blocks, score = block_scores(session, question)
    by_keys = passage_ranks(idx.spans, blocks, score)
    bm = idx.scores(question)
    by_words = np.full(idx.n, np.inf)
    held = np.flatnonzero(bm > 0)
    by_words[held[np.argsort(-bm[held], kind="stable")]] = np.arange(1, held.size + 1)
    fused = 1.0 / (RRF_K + by_keys) + 1.0 / (RRF_K + by_words)   # 1 / inf = 0: not in that ranking
    order = np.argsort(-fused, kind="stable")
    return [(int(idx.spans[i, 0]), int(idx.spans[i, 1]), float(fused[i])) for i in order.tolist() if fused[i] > 0]


def mix_mass(session, question: str, keep: int, lines: int = LINES) -> dict[int, float]:
    """The mix locator's mass for `question`: `lexical.spread` of the fused ranking."""
    ranked = mix_ranked(session, question, lines)
    if not ranked:
        raise KvpotError("the mix locator ranked no passage of the input")
    return spread(ranked, keep)


def ranked_spans(name: str, session, question: str, located=None, lines: int = LINES) -> list[tuple[int, int, float]]:
    """Locator `name`'s ranking for `question`, best first, as (first stream position, end, score): the keys
    locator's blocks, bm25's and mix's passages, the pot's passages of its locating answer (`located`: what
    locate_with("pot") gave; up to TOP_RANKED, as `--sources` ranks them). Every block or passage a locator
    ranks is listed (bm25: those holding a word of the question)."""
    if name == "keys":
        return keys_ranked(session, question)
    if name == "bm25":
        return index_for(session, lines).ranked(question)
    if name == "mix":
        return mix_ranked(session, question, lines)
    if name == "pot":
        if located is None:
            raise KvpotError("internal: the pot's ranking needs its locating answer")
        return rank(located.mass, session.source_map, TOP_RANKED, session.engine.policy.sink_tokens())
    raise KvpotError(f"unknown locator {name!r}")
