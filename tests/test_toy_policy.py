"""Adding a method touches its own file plus the registry: tests/toy_policy.py, registered here, reads a
document through the Engine on the test model like any shipped policy."""

from __future__ import annotations

import numpy as np
import pytest
from toy_policy import EveryNth

import kvpot.policies
from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import StreamingLLM, make_policy, register_policy

BUDGET, CHUNK, STRIDE = 64, 32, 3


@pytest.fixture
def registry(monkeypatch):
    """The registry with the toy added, for this test alone (the shipped list is checked elsewhere)."""
    monkeypatch.setattr(kvpot.policies, "POLICIES", dict(kvpot.policies.POLICIES))
    register_policy(EveryNth)
    return kvpot.policies.POLICIES


def toy_rule(held: list[int], budget: int, stride: int) -> list[int]:
    """EveryNth's choice, restated: multiples of stride newest first, then the rest newest first."""
    ranked = sorted(held, key=lambda p: (p % stride != 0, -p))
    return sorted(ranked[:budget])


def test_the_registry_builds_the_toy_from_a_spec(registry):
    assert registry["every_nth"] is EveryNth
    assert make_policy("every_nth:stride=3") == EveryNth(stride=3)
    with pytest.raises(KvpotError, match="every_nth has no parameter 'window'"):
        make_policy("every_nth:window=3")


def test_register_policy_refuses_a_taken_or_unspellable_name(registry):
    register_policy(EveryNth)  # the same class again: nothing changes
    assert registry["every_nth"] is EveryNth
    taken = type("Taken", (EveryNth,), {"name": "streaming"})
    with pytest.raises(KvpotError, match="'streaming' is taken by StreamingLLM"):
        register_policy(taken)
    assert registry["streaming"] is StreamingLLM
    with pytest.raises(KvpotError, match="lowercase letters"):
        register_policy(type("Spaced", (EveryNth,), {"name": "every nth"}))
    with pytest.raises(KvpotError, match="Policy subclass"):
        register_policy(int)


def test_the_toy_reads_a_document_longer_than_its_budget_and_answers(gemma_path, registry):
    text = logbook(n_entries=12, seed=3)[0]
    eng = Engine(str(gemma_path), make_policy(f"every_nth:stride={STRIDE}"),
                 EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2))
    held: list[int] = []   # the stream positions the pot holds, by the rule restated above
    seen = 0               # tokens read (the BOS included)
    compactions = 0

    def on_chunk(ev):
        nonlocal held, seen, compactions
        held, seen = held + list(range(seen, ev.tokens_read)), ev.tokens_read
        assert ev.cells_peak == len(held)
        if ev.compacted:
            compactions += 1
            held = toy_rule(held, BUDGET, STRIDE)
            assert ev.cells == BUDGET
        assert ev.cells == len(held)
        np.testing.assert_array_equal(eng.positions, np.broadcast_to(held, eng.positions.shape))

    eng.feed_text(text, on_chunk=on_chunk)
    assert seen == eng.tokens_seen > 4 * BUDGET
    assert compactions == eng.n_compactions >= 4
    assert min(held) < seen - BUDGET  # older tokens than the newest BUDGET: the rule, not recency, chose

    answer = "".join(eng.answer(" The schooner is called the", max_tokens=6))
    assert answer.strip()
    # the question and the answer's tokens (all but the last, which never enters the cache) follow the pot
    np.testing.assert_array_equal(eng.positions[0, 0], held + list(range(seen, eng.tokens_seen)))
    eng.close()
