"""The lexical locator (kvpot.locator.lexical) and the combined one (kvpot.locator.mix): words as a question names
them, passages that cover the text, BM25 scores against the formula computed here, the mass the focused read
takes, the index built once per reading, and inputs that cannot be read again or changed since refused.

A reading here is a source map built from the file's own pieces (one stream position per character), so no
model is needed; tests/test_bench_locate.py runs every locator on a real reading."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.ingest.sources import STDIN, collect_sources
from kvpot.locator import lexical
from kvpot.locator.lexical import LexicalIndex, bm25_mass, cut, index_for, spread, words
from kvpot.locator.mix import RRF_K, mix_ranked, passage_ranks
from kvpot.locator.sources import PASSAGE_TOKENS, SourceMap, rank_between

K1, B = 1.5, 0.75  # bm25s' defaults (Lucene's variant)


def reading(path) -> SimpleNamespace:
    """A session-like reading of `path`: its source map with one stream position per character, and digests."""
    src = collect_sources([str(path)])
    smap = SourceMap()
    at = 0
    for piece in src.pieces():
        smap.add(at, at, len(piece), [ord(c) for c in piece], lambda t: chr(t).encode(), text=piece)
        at += len(piece)
    smap.marks = list(src.marks)
    return SimpleNamespace(source_map=smap, source_set=src, sources=[{"name": str(path)}])


def corpus(n: int = 40, rare_at: int = 23) -> str:
    """n paragraphs of 3 lines with common words, one of them naming a rare version and bug number."""
    lines = []
    for i in range(n):
        lines += [f"the build of package number {i} ran on the main server", "logs were kept and the tests passed",
                  ("glibc 2.31-13 fixed #998877 in resolver" if i == rare_at else f"nothing else happened at step {i}")]
    return "\n".join(lines) + "\n"


def test_words_keep_identifiers_versions_and_bug_numbers():
    got = words("Fixed in GLIBC 2.31-13, see bug #123456 and os.path.join(); What is the e-mail of foo_bar?")
    for w in ("glibc", "2.31-13", "2", "31", "13", "#123456", "123456", "os.path.join", "path", "e-mail", "foo_bar"):
        assert w in got, w
    assert "fixed" in got and "Fixed" not in got        # lowercased
    assert not {"the", "what", "is", "and", "of"} & set(got)  # common words left out
    assert "join()" not in got and "13," not in got      # no punctuation kept


@pytest.mark.parametrize("lines,chars", [(1, None), (3, None), (24, None), (4, 50), (24, 7)])
def test_passages_cover_the_text_within_their_size(lines, chars):
    text = corpus(12) + "x" * 130 + " word" * 40 + "\n\n\nlast line without end"
    got = cut(text, lines, chars)
    cap = chars or lines * lexical.CHARS_PER_LINE
    assert got[0][0] == 0 and got[-1][1] == len(text)
    assert all(a < b for a, b in got) and all(b == c for (_, b), (c, _) in zip(got, got[1:]))
    assert all(b - a <= cap for a, b in got)
    assert all(text[a:b].count("\n") <= lines for a, b in got)
    # a passage ends early only where the next line would not fit, and a long line is cut at a space where one is
    for (a, b), (c, d) in zip(got, got[1:]):
        if text[a:b].count("\n") < lines and text[b - 1] == "\n":
            nxt = text.find("\n", c)
            assert (len(text) if nxt < 0 else nxt + 1) - a > cap
    if chars == 50:
        inside = [text[b - 1] for a, b in got[:-1] if text[b - 1] not in "\nx"]
        assert inside and set(inside) == {" "}


def reference_bm25(docs: list[list[str]], query: list[str]) -> np.ndarray:
    """Lucene's BM25, written out: idf = ln(1 + (N - df + 0.5) / (df + 0.5)) times tf / (tf + k1 (1 - b + b dl / avgdl))
    (Lucene dropped the classic (k1 + 1) factor of the numerator: a constant, the same ranking)."""
    n = len(docs)
    avg = sum(len(d) for d in docs) / n
    df = Counter(w for d in docs for w in set(d))
    out = np.zeros(n)
    for i, d in enumerate(docs):
        tf = Counter(d)
        for w in set(query):
            if tf[w]:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                out[i] += idf * tf[w] / (tf[w] + K1 * (1 - B + B * len(d) / avg))
    return out


def test_scores_are_bm25_and_the_rare_words_passage_ranks_first(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    idx = index_for(s, lines=6)
    text = path.read_text()
    docs = [words(text[a:b]) for a, b in cut(text, 6)]
    question = "Which glibc version fixed bug 998877 on the build server?"
    np.testing.assert_allclose(idx.scores(question), reference_bm25(docs, words(question)), rtol=1e-4)
    ranked = idx.ranked(question)
    first = text.index("glibc 2.31-13")
    assert ranked[0][0] <= first < ranked[0][1]  # positions are characters here
    assert [r[2] for r in ranked] == sorted((r[2] for r in ranked), reverse=True) and all(r[2] > 0 for r in ranked)
    assert idx.scores("zebra quokka").max() == 0 and idx.ranked("zebra quokka") == []


def test_the_mass_is_the_ranking_the_focused_read_takes(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    question = "glibc 2.31-13 build server number 7"
    ranked = index_for(s).ranked(question)
    keep = 4
    mass = bm25_mass(s, question, keep)
    assert mass == spread(ranked, keep)
    floor = ranked[keep][2]
    for lo, hi, score in ranked[:keep]:
        got = {p: w for p, w in mass.items() if lo <= p < hi}
        assert len(got) == PASSAGE_TOKENS and max(got) - min(got) == PASSAGE_TOKENS - 1
        assert abs((lo + hi) // 2 - (min(got) + PASSAGE_TOKENS // 2)) <= 1  # the middle of the passage
        assert sum(got.values()) == pytest.approx(score - floor + 1e-6)
    assert sum(1 for _ in mass) == keep * PASSAGE_TOKENS
    # the focused read's ranking takes one passage of each, best first
    got = rank_between(mass, 0, s.source_map.end_pos, top=keep)
    assert [next(i for i, r in enumerate(ranked) if r[0] <= a < r[1]) for a, _, _ in got] == list(range(keep))


def test_the_index_is_built_once_per_reading(tmp_path, monkeypatch):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    built = []
    real = LexicalIndex.build.__func__

    def counted(cls, *a, **k):
        built.append(1)
        return real(cls, *a, **k)

    monkeypatch.setattr(LexicalIndex, "build", classmethod(counted))
    first = index_for(s)
    assert index_for(s) is first and len(built) == 1       # a second question: the same index
    assert index_for(s, lines=6) is not first and len(built) == 2
    other = reading(path)                                   # another reading (its own source map): its own index
    assert index_for(other) is not first and len(built) == 3


def test_a_changed_file_is_refused(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    text = path.read_text()
    path.write_text(text.replace("glibc 2.31-13", "glibc 2.31-14"))  # the same length, another text
    with pytest.raises(KvpotError, match="changed since it was read") as e:
        index_for(s)
    assert "\n" not in str(e.value)
    path.write_text(text[: len(text) // 2])                          # shorter
    with pytest.raises(KvpotError, match="changed since it was read"):
        index_for(reading_of(s))


def reading_of(s: SimpleNamespace) -> SimpleNamespace:
    """The same reading under another identity (no index cached for it)."""
    return SimpleNamespace(source_map=SourceMap(s.source_map.pos, s.source_map.char, s.source_map.end_pos,
                                                s.source_map.end_char, s.source_map.marks, s.source_map.digests),
                           source_set=s.source_set, sources=s.sources)


def test_stdin_and_a_question_without_a_word_of_the_input_are_refused(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    piped = SimpleNamespace(source_map=s.source_map, source_set=None, sources=[{"name": STDIN}])
    with pytest.raises(KvpotError, match="cannot be read again"):
        index_for(piped)
    with pytest.raises(KvpotError, match="no word of the question"):
        bm25_mass(s, "zebra quokka?", 4)


def test_passage_ranks_by_the_best_block_overlapping_them():
    passages = np.array([[0, 100], [100, 150], [150, 400], [400, 410]])
    blocks = np.array([[0, 64], [64, 128], [128, 192], [192, 256], [256, 320]])
    score = np.array([1.0, 5.0, 2.0, 9.0, 0.5])
    # best block of each: p0 -> 5 (block 1), p1 -> 5 (blocks 1, 2), p2 -> 9 (blocks 2..4), p3 -> none
    np.testing.assert_array_equal(passage_ranks(passages, blocks, score), [2, 3, 1, np.inf])


def test_mix_fuses_the_two_rankings_by_reciprocal_rank(tmp_path, monkeypatch):
    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    idx = index_for(s)
    rng = np.random.default_rng(0)
    edges = np.arange(0, s.source_map.end_pos + 64, 64)
    blocks = np.stack([edges[:-1], np.minimum(edges[1:], s.source_map.end_pos)], axis=1)
    score = rng.normal(size=len(blocks))
    monkeypatch.setattr("kvpot.locator.mix.block_scores", lambda session, q: (blocks, score))
    question = "glibc 2.31-13 build server"
    got = mix_ranked(s, question)
    # the reference: each passage's rank in either list, fused as 1/(k + rank)
    bm = idx.scores(question)
    by_words = {i: r for r, i in enumerate(sorted(np.flatnonzero(bm > 0), key=lambda i: (-bm[i], i)), 1)}
    best = [max(sc for (b0, b1), sc in zip(blocks, score) if b0 < hi and lo < b1) for lo, hi in idx.spans]
    by_keys = {i: r for r, i in enumerate(sorted(range(idx.n), key=lambda i: (-best[i], i)), 1)}
    want = {i: 1 / (RRF_K + by_keys[i]) + (1 / (RRF_K + by_words[i]) if i in by_words else 0) for i in range(idx.n)}
    assert [(a, b) for a, b, _ in got] == [tuple(idx.spans[i]) for i in sorted(want, key=lambda i: (-want[i], i))]
    assert [f for *_, f in got] == pytest.approx(sorted(want.values(), reverse=True))


def test_a_question_that_singles_out_no_passage_goes_to_the_pot(tmp_path):
    """locating.route: the peak is the best passage's score over the mean of the others holding a question word (from
    the BM25 scores computed here); a question whose words every passage holds alike goes to the pot, one naming
    the rare passage's words to a focused read, and mix keeps the keys where no word is held."""
    from kvpot.session.locating import PotAnswers, locate_with, route

    path = tmp_path / "log.txt"
    path.write_text(corpus())
    s = reading(path)
    s.settings = SimpleNamespace(locator="bm25")
    idx = index_for(s)
    text = path.read_text()
    docs = [words(text[a:b]) for a, b in cut(text)]
    for question in ("Which glibc version fixed bug 998877 on the build server?", "What ran on the server?"):
        ref = reference_bm25(docs, words(question))
        held = np.sort(ref[ref > 0])[::-1]
        assert idx.peak(question) == pytest.approx(held[0] / held[1:].mean(), rel=1e-4)
    assert idx.peak("Which glibc version?") == float("inf")  # one passage alone holds the words: singled out
    specific, vague = idx.peak("Which glibc version fixed bug 998877 on the build server?"), idx.peak("What ran on the server?")
    assert specific >= lexical.FLAT > vague      # the corpus: every paragraph ran on the server, one names glibc
    assert route("bm25", s, "Which glibc version fixed bug 998877 on the build server?") is None
    assert "whole input" in route("bm25", s, "What ran on the server?")
    assert "whole input" in route("mix", s, "What ran on the server?")
    assert route("bm25", s, "zebra quokka?") == "no word of the question is in the input"
    assert route("mix", s, "zebra quokka?") is None and route("keys", s, "What ran on the server?") is None
    with pytest.raises(PotAnswers, match="whole input"):
        locate_with("bm25", s, "What ran on the server?")
