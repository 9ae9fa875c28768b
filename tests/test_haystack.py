"""The harder niah haystack (kvpot.bench.haystack): no model needed, tokens counted by a stand-in."""

from __future__ import annotations

import re

import pytest

from kvpot.bench.haystack import NEEDLE_TEMPLATES, PLACES, draw_needles, make_prose_haystack, prose_paragraphs


def words(text: str) -> int:
    """Stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def test_same_seed_same_haystack_other_seed_other_one():
    a = make_prose_haystack(words, 3000, 0.5, seed=3, n_keys=4)
    b = make_prose_haystack(words, 3000, 0.5, seed=3, n_keys=4)
    c = make_prose_haystack(words, 3000, 0.5, seed=4, n_keys=4)
    assert a == b
    assert a.text != c.text and a.key != c.key


@pytest.mark.parametrize("n_keys", [1, 4])
def test_every_needle_is_there_once_and_the_asked_one_at_its_depth(n_keys):
    for seed in range(5):
        for depth in (0.0, 0.3, 1.0):
            hay = make_prose_haystack(words, 4000, depth, seed=seed, n_keys=n_keys)
            assert hay.needles[0].key == hay.key and hay.needles[0].place == hay.place
            for n in hay.needles:
                assert hay.text.count(n.key) == 1, (seed, depth, n)
                assert hay.text.count(n.text) == 1
            paras = hay.text.rstrip("\n").split("\n\n")
            at = paras.index(hay.needles[0].text)
            # the needle sits between filler paragraphs at its depth: the filler before it is
            # round(depth * n_filler) paragraphs, give or take the distractors placed before it
            n_filler = len(paras) - n_keys
            before = sum(1 for p in paras[:at] if p not in {n.text for n in hay.needles})
            assert before == round(depth * n_filler)


def test_length_is_close_to_what_was_asked():
    for n in (1000, 8000):
        hay = make_prose_haystack(words, n, 0.5, seed=1, n_keys=4)
        longest = max(words(p) for p in prose_paragraphs()) + 2
        assert n - longest <= words(hay.text) <= n


def test_multikey_distractors_are_distinct_facts_of_the_same_kind():
    for seed in range(20):
        needles = draw_needles(seed, 0.5, 4)
        places = [n.place for n in needles]
        keys = [n.key for n in needles]
        assert len(set(places)) == 4 and set(places) <= set(PLACES)
        assert len(set(keys)) == 4 and all(re.fullmatch(r"[1-9]\d{4}", k) for k in keys)
        assert len({k[:3] for k in keys}) == 4  # no near-miss key shares the asked key's first digits
        assert all(abs(n.depth - 0.5) >= 0.05 for n in needles[1:])
        # every needle states one of the known phrasings of its own place and key
        for n in needles:
            assert n.text in {t.format(place=n.place, key=n.key) for t in NEEDLE_TEMPLATES}


def test_needles_are_phrased_more_than_one_way():
    phrasings = set()
    for seed in range(40):
        n = draw_needles(seed, 0.5, 1)[0]
        phrasings.add(n.text.replace(n.key, "{key}").replace(n.place, "{place}"))
    assert phrasings == set(NEEDLE_TEMPLATES)


def test_filler_is_varied_prose_not_a_repeated_sentence():
    hay = make_prose_haystack(words, 8000, 0.5, seed=0, n_keys=1)
    paras = [p for p in hay.text.rstrip("\n").split("\n\n") if p != hay.needles[0].text]
    assert len(paras) == len(set(paras)) > 50
    sentences = [s for p in paras for s in re.split(r"(?<=[.!?]) ", p)]
    assert len(set(sentences)) > 0.95 * len(sentences)
    # prose, not code: no doctest prompts, no braces, mostly letters
    assert ">>>" not in hay.text and "{" not in hay.text
    assert sum(c.isalpha() or c.isspace() for c in hay.text) > 0.85 * len(hay.text)
