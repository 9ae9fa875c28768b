"""Sampling (kvpot.session.sampling) against the definitions of llama.cpp's samplers, computed here."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.session.sampling import Sampler

RNG = np.random.default_rng(7)
LOGITS = RNG.normal(size=50) * 2


def test_temperature_zero_is_argmax():
    assert Sampler(temp=0).pick(LOGITS, []) == int(np.argmax(LOGITS))


def test_repeat_penalty_moves_greedy_off_a_recent_token():
    top, second = np.argsort(-LOGITS)[:2]
    z = LOGITS.copy()
    z[top] = abs(z[second]) + 0.1  # positive, just above the runner-up
    assert Sampler(temp=0, repeat_penalty=1.5).pick(z, [int(top)]) == second
    assert Sampler(temp=0, repeat_penalty=1.0).pick(z, [int(top)]) == top


def test_top_k_one_is_greedy_at_any_temperature():
    s = Sampler(temp=5.0, top_k=1, seed=1)
    assert {s.pick(LOGITS, []) for _ in range(50)} == {int(np.argmax(LOGITS))}


def test_same_seed_same_tokens():
    a, b = Sampler(temp=1.0, seed=3), Sampler(temp=1.0, seed=3)
    assert [a.pick(LOGITS, []) for _ in range(30)] == [b.pick(LOGITS, []) for _ in range(30)]


def test_unfiltered_draws_follow_softmax_of_logits_over_temp():
    temp, n = 1.7, 20_000
    s = Sampler(temp=temp, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    counts = np.bincount([s.pick(LOGITS, []) for _ in range(n)], minlength=len(LOGITS))
    p = np.exp(LOGITS / temp - (LOGITS / temp).max())
    p /= p.sum()
    # each frequency within 5 standard errors of its probability
    assert np.all(np.abs(counts / n - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-4)


def test_filters_keep_only_their_candidates():
    p = np.exp(LOGITS - LOGITS.max())
    p /= p.sum()
    order = np.argsort(-p)
    nucleus = set(order[:np.searchsorted(np.cumsum(p[order]), 0.6) + 1].tolist())
    above = set(np.flatnonzero(p >= 0.2 * p.max()).tolist())
    for kw, allowed in (({"top_k": 3, "top_p": 1.0, "min_p": 0.0}, set(order[:3].tolist())),
                        ({"top_k": 0, "top_p": 0.6, "min_p": 0.0}, nucleus),
                        ({"top_k": 0, "top_p": 1.0, "min_p": 0.2}, above)):
        s = Sampler(temp=3.0, seed=5, **kw)
        assert {s.pick(LOGITS, []) for _ in range(2000)} <= allowed, kw


@pytest.mark.parametrize("kw", [{"temp": -1}, {"top_p": 0}, {"min_p": 1}, {"repeat_penalty": 0}, {"seed": -1},
                                {"top_k": -2}])
def test_bad_values_are_one_line(kw):
    with pytest.raises(KvpotError, match="^--"):
        Sampler(**kw)
