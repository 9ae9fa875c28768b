"""studies.locret_trace (the diagnosis of Locret's prose-needle misses) on a tiny haystack: what it
counts agrees with the pot it read, and its oracle really keeps the code's digits in every pair."""

from __future__ import annotations

import json

import numpy as np

from studies import locret_trace

TINY = ["-m", "gemma3-270m", "-n", "1500", "-d", "0.3", "--budget", "384", "--chunk", "128", "-t", "2"]


def test_percentile_in_pair_counts_the_cells_scored_below():
    score = np.array([[[0.1, 0.9, 0.5, 0.3]], [[4.0, 3.0, 2.0, 1.0]]], dtype=np.float32)   # [L=2, H=1, N=4]
    held = np.zeros_like(score, dtype=bool)
    held[0, 0, 2] = True   # 0.5: above 0.1 and 0.3
    held[1, 0, 3] = True   # 1.0: the lowest
    np.testing.assert_allclose(locret_trace.percentile_in_pair(score, held), [0.5, 0.0])
    held[1] = False        # a pair without the cell is left out
    np.testing.assert_allclose(locret_trace.percentile_in_pair(score, held), [0.5])


def test_trace_and_its_oracle(gemma_path, tmp_path):
    plain = locret_trace.main([*TINY, "--json", str(tmp_path / "plain.json")])
    assert json.loads((tmp_path / "plain.json").read_text()) == plain
    assert plain["compactions"], "the haystack is longer than the budget: compactions hold the code"
    n_digits = len(plain["key"])
    for e in plain["compactions"]:
        assert len(e["digits"]) == n_digits
        for d in e["digits"]:
            assert 0 <= d["kept"] <= d["held"] <= plain["pairs"]
            assert d["held"] == 0 or 0.0 <= d["score_percentile"] <= 1.0
    oracle = locret_trace.main([*TINY, "--keep-digits"])
    assert oracle["digits_held_at_end"] == [oracle["pairs"]] * n_digits
    for e in oracle["compactions"]:
        assert all(d["kept"] == d["held"] == oracle["pairs"] for d in e["digits"])
