"""The lexical locator (`--locator bm25`): BM25 over fixed passages of the input's text, read again from the files.

What a field engineer would try first, and what the model's own locators (kvpot.locator.keys, the pot's
attention) are measured against (`kvpot bench locate`). The joined input (the text the model read, headings of
several inputs included) is cut into passages of LINES lines, at most LINES x CHARS_PER_LINE characters each
(a file of very long lines, a one-line log, is cut inside its lines, at a space where one is near); each passage
is a bag of words (`words`) and BM25 (bm25s, Lucene's variant, k1 = 1.5, b = 0.75) scores it against the
question's words.

The index is built at the first question from the inputs read again, checked against the digests of the text
that was read (a file changed since is refused: its passages are not the ones the stream positions name), and
kept for the session's source map (`index_for`): later questions of a chat score it without reading or
tokenising the input again. It holds the passages' places and BM25's sparse term-passage matrix: about the
size of the text itself (~1 MB at 128K tokens); the text is not kept.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.sources import PASSAGE_TOKENS, DigestCheck, SourceMap, position_at, reread

LINES = 24             # lines per passage: measured against 12 and 48 (`kvpot bench locate --bm25-lines`)
CHARS_PER_LINE = 100   # a passage holds at most LINES x this many characters: about the focused read's window
                       # around a passage (kvpot.session.focus.REACH_CHARS each side), so the window holds it
CACHED = 4             # indexes kept (one per source map: a session's input, or a few in a benchmark)
# a ranking whose best passage scores under FLAT times the mean of the other passages holding a word of the
# question singles out no passage: the question is about the whole input ("what is this file about?"), and the
# pot, which read all of it, answers (kvpot.session.locating.route). Chosen by `kvpot bench route`
# (docs/bench/locate/route-1.5b.json): at 32K, 64K and 128K it sends 74 % of such questions to the pot and 1.4 %
# of the question set's, all paraphrases; 1.6 sends 51 % and 0.4 %, and the share falls as inputs grow
FLAT = 1.8

# a word: a run of letters, digits and underscores (an identifier), joined to the next such run by a dot, a
# hyphen or a colon ("2.31-13", "os.path", "e-mail"), with a leading "#" kept ("#123456")
_WORD = re.compile(r"#?\w+(?:[.\-:]\w+)*")
_PARTS = re.compile(r"\w+")
_STOP: frozenset[str] | None = None


def _stopwords() -> frozenset[str]:
    global _STOP
    if _STOP is None:
        from bm25s.stopwords import STOPWORDS_EN_PLUS

        _STOP = frozenset(STOPWORDS_EN_PLUS)
    return _STOP


def words(text: str) -> list[str]:
    """The terms of `text`, lowercased: each word as written ("2.31-13", "#123456", "os.path") and, where it
    joins several parts, each part too ("2", "31", "13", "123456", "os", "path"), so a question that names
    one part finds the word; common English words (bm25s' STOPWORDS_EN_PLUS) left out."""
    stop = _stopwords()
    out: list[str] = []
    for m in _WORD.finditer(text.lower()):
        w = m.group()
        if w not in stop:
            out.append(w)
        parts = _PARTS.findall(w)
        if parts != [w]:
            out += [p for p in parts if p not in stop]
    return out


def cut(text: str, lines: int = LINES, chars: int | None = None) -> list[tuple[int, int]]:
    """[start, end) of each passage of `text`: `lines` lines, or fewer where they would pass `chars`
    characters (default lines x CHARS_PER_LINE); a line longer than that is cut at the last space before
    the limit (in its second half), else at the limit. Every character is in one passage."""
    cap = chars or lines * CHARS_PER_LINE
    if lines < 1 or cap < 1:
        raise KvpotError(f"a passage needs at least one line and one character (got {lines} lines, {cap} characters)")
    out: list[tuple[int, int]] = []
    start, n = 0, 0
    at = 0
    while at < len(text):
        nl = text.find("\n", at)
        end = len(text) if nl < 0 else nl + 1
        while end - start > cap:  # the passage would pass its size: end it before this line, or inside it
            if at > start:
                out.append((start, at))
                start, n = at, 0
                continue
            sp = text.rfind(" ", start + cap // 2, start + cap)
            stop = sp + 1 if sp >= 0 else start + cap
            out.append((start, stop))
            start = at = stop
        n += 1
        at = end
        if n == lines:
            out.append((start, at))
            start, n = at, 0
    if start < len(text):
        out.append((start, len(text)))
    return out


@dataclass
class LexicalIndex:
    """BM25 over the passages of one reading: their characters and stream positions [n, 2] each."""
    chars: np.ndarray
    spans: np.ndarray
    lines: int
    _bm25: object

    @classmethod
    def build(cls, text: str, smap: SourceMap | None, lines: int = LINES) -> LexicalIndex:
        """The index of `text`; `smap` None (text never read, `kvpot bench route`) gives the spans in characters."""
        import bm25s

        cuts = cut(text, lines)
        chars = np.asarray(cuts, dtype=np.int64).reshape(-1, 2)
        spans = chars.copy() if smap is None else np.asarray(
            [(position_at(smap, a), position_at(smap, b)) for a, b in cuts], dtype=np.int64).reshape(-1, 2)
        bm25 = bm25s.BM25()
        # the empty token bm25s adds keeps an empty passage (a run of blank lines) indexable
        bm25.index([words(text[a:b]) for a, b in cuts], show_progress=False)
        return cls(chars, spans, lines, bm25)

    @property
    def n(self) -> int:
        return int(self.chars.shape[0])

    def scores(self, question: str) -> np.ndarray:
        """[n] float: each passage's BM25 score for the question's words (0 where it holds none of them)."""
        vocab = self._bm25.vocab_dict
        ids = [vocab[w] for w in dict.fromkeys(words(question)) if w in vocab and w]
        if not ids or not self.n:
            return np.zeros(self.n)
        return np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float64)

    def peak(self, question: str) -> float:
        """How far the best passage stands out: its score over the mean score of the other passages holding a
        word of the question (1.0 when they all score alike; inf when it alone holds one; 0.0 when none does)."""
        s = np.sort(self.scores(question))[::-1]
        held = s[s > 0]
        if held.size < 2:
            return float("inf") if held.size else 0.0
        return float(held[0] / held[1:].mean())

    def ranked(self, question: str) -> list[tuple[int, int, float]]:
        """(first stream position, end, score) of every passage that holds a word of the question, best first
        (ties in the input's order)."""
        s = self.scores(question)
        order = np.argsort(-s, kind="stable")
        return [(int(self.spans[i, 0]), int(self.spans[i, 1]), float(s[i])) for i in order.tolist() if s[i] > 0]


_cache: OrderedDict[tuple[int, int, int], tuple[SourceMap, LexicalIndex]] = OrderedDict()


def index_for(session, lines: int = LINES) -> LexicalIndex:
    """The lexical index of the session's input: built once per source map (kept while the map reads the same
    stream), from the inputs read again and checked to be the text that was read."""
    smap = session.source_map
    key = (id(smap), smap.end_pos, lines)
    got = _cache.get(key)
    if got is not None and got[0] is smap:
        _cache.move_to_end(key)
        return got[1]
    idx = LexicalIndex.build(read_again(session), smap, lines)
    _cache[key] = (smap, idx)
    while len(_cache) > CACHED:
        _cache.popitem(last=False)
    return idx


def read_again(session) -> str:
    """The joined text the session read (up to where its source map ends), read again from its inputs.
    Refused with one line where they cannot be read again or are not the text that was read."""
    smap = session.source_map
    if not smap.pos:
        raise KvpotError("nothing of the input is mapped to the stream: the bm25 locator has no text to rank")
    again = reread(session)
    if again is None:
        raise KvpotError("the input cannot be read again (stdin, a pipe, or a file no longer there): the bm25 "
                         "locator needs its text")
    whole = SimpleNamespace(start=0, end=smap.end_char)
    check = DigestCheck(smap, [whole]) if smap.digests is not None else None
    parts: list[str] = []
    seen = 0
    for piece in again.pieces():
        if check is not None:
            check.feed(piece)
        parts.append(piece[:max(0, smap.end_char - seen)])
        seen += len(piece)
        if seen >= smap.end_char:
            break
    n = len(again.marks)
    changed = seen < smap.end_char or again.marks[:n] != smap.marks[:n] or (check is not None and not check.same(whole))
    if changed:
        names = sorted({m.source for m in smap.marks if m.source}) or ["an input"]
        raise KvpotError(f"{', '.join(names)} changed since it was read: the bm25 locator cannot rank its passages")
    return "".join(parts)


def spread(ranked: list[tuple[int, int, float]], keep: int) -> dict[int, float]:
    """Mass by stream position from a ranking (first position, end, score; best first), as the keys locator
    gives it (kvpot.session.locating.block_mass): the `keep` best, each its score above the first one left out
    (0 where none is), on the middle PASSAGE_TOKENS positions of its span, so the focused read's ranking
    (kvpot.locator.sources.rank) takes one passage from each, in this order."""
    top = ranked[:keep]
    floor = ranked[keep][2] if len(ranked) > keep else min(0.0, min((s for *_, s in top), default=0.0))
    mass: dict[int, float] = {}
    for lo, hi, score in top:
        mid = (lo + hi) // 2
        a, z = max(lo, mid - PASSAGE_TOKENS // 2), min(hi, mid - PASSAGE_TOKENS // 2 + PASSAGE_TOKENS)
        w = (score - floor + 1e-6) / max(1, z - a)
        for p in range(a, z):
            mass[p] = w
    return mass


def bm25_mass(session, question: str, keep: int, lines: int = LINES) -> dict[int, float]:
    """The bm25 locator's mass for `question` (`spread` of its ranking). Refused where no word of the question
    is in the input: nothing to locate by."""
    ranked = index_for(session, lines).ranked(question)
    if not ranked:
        raise KvpotError("no word of the question is in the input: the bm25 locator finds no passage")
    return spread(ranked, keep)
