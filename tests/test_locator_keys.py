"""The read-once locator's keys (kvpot.locator.keys): block means as numpy computes them from the same keys,
whatever the chunks; kept by the engine for every block read, whatever the pot keeps; saved and reopened with a
context; and the question's lookup queries read without leaving anything in the cache."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.ingest.sources import collect_sources
from kvpot.locator.keys import BlockKeys
from kvpot.locator.query import question_tokens
from kvpot.models.gguf_file import read_model_facts
from kvpot.policies import make_policy
from kvpot.session.locating import block_mass, locate_with
from kvpot.session.session import Session
from kvpot.session.settings import RunSettings

L, H, D = 3, 2, 8


def _keys(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(L, H, n, D)).astype(np.float32)


@pytest.mark.parametrize("cuts", [[100], [7, 93], [16, 16, 16, 52], [1] * 100, [63, 1, 36]])
def test_block_means_do_not_depend_on_the_chunks(cuts):
    k = _keys(sum(cuts))
    bk = BlockKeys(L, H, D, block=16)
    at = 0
    for n in cuts:
        bk.add(k[:, :, at:at + n], 5 + at)
        at += n
    edges = list(range(0, 100, 16)) + [100]
    want = np.stack([k[:, :, a:b].mean(axis=2) for a, b in zip(edges, edges[1:])])
    q = np.random.default_rng(1).normal(size=(L, H, D)).astype(np.float32)
    assert bk.n_blocks == len(want)
    np.testing.assert_array_equal(bk.spans(), np.array([[5 + a, 5 + b] for a, b in zip(edges, edges[1:])]))
    np.testing.assert_allclose(bk.head_scores(q), np.einsum("blhd,lhd->blh", want, q), rtol=2e-3, atol=2e-3)


def test_a_jump_in_the_stream_ends_the_block():
    k = _keys(20)
    bk = BlockKeys(L, H, D, block=16)
    bk.add(k[:, :, :10], 0)
    bk.add(k[:, :, 10:], 500)  # a chat turn read in between: the next block starts there
    np.testing.assert_array_equal(bk.spans(), [[0, 10], [500, 510]])


def test_scores_are_standardised_per_head_and_weighed():
    k = _keys(64, seed=3)
    bk = BlockKeys(L, H, D, block=8)
    bk.add(k, 0)
    q = np.random.default_rng(4).normal(size=(L, H, D)).astype(np.float32)
    s = bk.head_scores(q).astype(np.float64)
    z = (s - s.mean(axis=0)) / s.std(axis=0)
    w = np.random.default_rng(5).random((L, H))
    np.testing.assert_allclose(bk.scores(q, w), (z * w).sum(axis=(1, 2)), rtol=1e-6)
    one = np.zeros((L, H))
    one[1, 0] = 1.0
    assert np.array_equal(np.argsort(bk.scores(q, one)), np.argsort(s[:, 1, 0]))


def test_state_round_trip_and_damage():
    bk = BlockKeys(L, H, D, block=16)
    bk.add(_keys(40), 0)
    values, arrays = bk.state()
    back = BlockKeys.from_state((L, H, D), values, arrays)
    q = np.ones((L, H, D), dtype=np.float32)
    np.testing.assert_array_equal(back.head_scores(q), bk.head_scores(q))
    np.testing.assert_array_equal(back.spans(), bk.spans())
    with pytest.raises(KvpotError, match="another model"):
        BlockKeys.from_state((L, H + 1, D), values, arrays)
    with pytest.raises(KvpotError, match="damaged"):
        BlockKeys.from_state((L, H, D), values, {**arrays, "len": arrays["len"][:-1]})
    with pytest.raises(KvpotError, match="damaged"):
        BlockKeys.from_state((L, H, D), {**values, "open_len": 99}, arrays)


def test_the_engine_keeps_every_block_whatever_the_pot_keeps(smollm2_path, logbook_doc):
    """The keys of blocks the pot evicted are still there. A read with a pot that keeps everything holds every
    key in its cells at the end: its reps are their block means. A small pot's read has a block for every block
    of it too; its first layer's keys (a token's own, before any attention) are the same, the later layers' are
    the keys as that pot read them (after attention over what it kept)."""
    tokens = Engine(str(smollm2_path), make_policy("streaming"), EngineConfig(budget=64, chunk=32))
    toks = tokens.model.tokenize(logbook_doc.read_text()[:6000])
    tokens.close()
    got = {}
    for budget in (96, len(toks) + 64):
        eng = Engine(str(smollm2_path), make_policy("streaming"), EngineConfig(budget=budget, chunk=32, locator_block=16))
        eng.feed(toks)
        got[budget] = eng.block_keys
        if budget > 96:
            assert eng.n_compactions == 0
            k, _ = eng.pot.read_at(0, eng.n_cells, 0, eng.facts.head_dim_k, eng.facts.head_dim_v)
            n = k.shape[2]
            edges = list(range(0, n, 16)) + [n]
            want = np.stack([k[:, :, a:b].mean(axis=2) for a, b in zip(edges, edges[1:])])
            q = np.random.default_rng(0).normal(size=want.shape[1:]).astype(np.float32)
            np.testing.assert_allclose(eng.block_keys.head_scores(q), np.einsum("blhd,lhd->blh", want, q),
                                       rtol=1e-2, atol=1e-2)
        else:
            assert eng.n_compactions > 0
        eng.close()
    small, full = got.values()
    assert small.n_blocks == full.n_blocks == -(-(len(toks) + 1) // 16)  # the BOS is read too
    np.testing.assert_array_equal(small.spans(), full.spans())
    q = np.random.default_rng(1).normal(size=(small.shape)).astype(np.float32)
    np.testing.assert_allclose(small.head_scores(q)[:, 0], full.head_scores(q)[:, 0], rtol=1e-2, atol=1e-2)
    assert not np.allclose(small.head_scores(q)[8:, -1], full.head_scores(q)[8:, -1], rtol=1e-2, atol=1e-2)


SMALL = RunSettings(budget=256, chunk=64, threads=2, prompt="completion", max_tokens=8, policy="infinipot", locator="keys")


def test_question_queries_leave_the_pot_as_it_was_and_the_context_keeps_the_keys(smollm2_path, logbook_doc, tmp_path):
    facts = read_model_facts(smollm2_path)
    s = Session(facts, "smollm2-135m", SMALL.check(), resettable=False)
    s.read(collect_sources([str(logbook_doc)]))
    eng = s.engine
    assert eng.n_compactions > 0 and eng.block_keys.n_blocks >= eng.tokens_seen // 64
    before = bytes(eng.ctx.seq_state())
    toks, cap = question_tokens(s, "Which ship docked at noon?")
    assert b"".join(eng.model.piece(t) for t in toks[cap[0]:cap[1]]).decode().strip() == "Which ship docked at noon?"
    q1 = eng.question_queries(toks, cap, 0)
    q2 = eng.question_queries(toks, cap, 0)
    assert q1 is not None and np.abs(q1).sum() > 0
    np.testing.assert_allclose(q1, q2, rtol=1e-4, atol=1e-4)  # nothing of the first stayed to change the second
    assert bytes(eng.ctx.seq_state()) == before
    mass = block_mass(s, "Which ship docked at noon?")
    assert mass and all(w > 0 for w in mass.values())
    path = tmp_path / "c.kvctx"
    s.save(path)
    want = eng.block_keys.head_scores(q1)
    eng.close()
    back = Session.reopen(path, facts, "smollm2-135m")
    np.testing.assert_array_equal(back.engine.block_keys.head_scores(q1), want)
    assert locate_with("keys", back, "Which ship docked at noon?").mass == mass
    back.engine.close()


def test_full_attention_keeps_no_keys_and_the_keys_locator_says_so(smollm2_path, logbook_doc):
    s = Session(read_model_facts(smollm2_path), "smollm2-135m",
                RunSettings(budget=2048, chunk=64, threads=2, prompt="completion", policy="full", locator="keys").check(),
                resettable=False)
    assert s.engine.block_keys is None
    with pytest.raises(KvpotError, match="no locator keys"):
        block_mass(s, "anything?")
    s.engine.close()


def test_the_saved_locator_is_checked_on_the_file_alone():
    """context_file's checks (engine_state.check_engine_values) run check_state before anything is restored."""
    from kvpot.locator.keys import check_state

    bk = BlockKeys(L, H, D, block=16)
    bk.add(_keys(40), 0)
    values, arrays = bk.state()
    check_state(values, arrays, tokens_seen=40)
    for bad_values, bad_arrays, why in [
            (values, arrays | {"first": arrays["first"][::-1].copy()}, "overlap"),
            (values, arrays | {"reps": arrays["reps"].astype(np.float32)}, "f16"),
            ({**values, "block": 0}, arrays, "out of range"),
            ({**values, "extra": 1}, arrays, "fields"),
            (values, {k: v for k, v in arrays.items() if k != "len"}, "missing")]:
        with pytest.raises(ValueError, match=why):
            check_state(bad_values, bad_arrays)
    with pytest.raises(ValueError, match="past the tokens read"):
        check_state(values, arrays, tokens_seen=39)


def test_only_a_keys_locator_keeps_keys_and_the_plan_counts_them(smollm2_path, logbook_doc):
    """bm25 and the pot's answer never score the keys: a reading for them keeps none. A reading for keys or mix
    keeps them, and the memory plan leaves room for them (fewer cells on the same device)."""
    from kvpot.locator.keys import keys_bytes
    from kvpot.session import auto_budget
    from kvpot.session.reading_plan import locator_bytes

    facts = read_model_facts(smollm2_path)
    src = collect_sources([str(logbook_doc)])
    for locator, kept in (("bm25", False), ("pot", False), ("keys", True), ("mix", True)):
        settings = RunSettings(budget=256, chunk=64, threads=2, prompt="completion", policy="infinipot",
                               locator=locator).check()
        s = Session(facts, "smollm2-135m", settings, resettable=False)
        assert (s.engine.block_keys is not None) is kept, locator
        s.engine.close()
        want = keys_bytes(facts.n_layer, facts.n_head_kv, facts.head_dim_k, src.text_bytes // 2) if kept else 0
        assert locator_bytes(facts, settings, src) == want
    per_cell = auto_budget.global_kv_bytes_per_cell(facts) + auto_budget.scores_bytes_per_cell(facts, 64, False)
    free = facts.file_bytes
    while True:  # the least free memory that holds a pot, then room for a thousand cells more
        try:
            auto_budget.plan_cells(facts, auto_budget.DeviceMemory(free, "a test"), 64, 1)
            break
        except KvpotError:
            free += 2**22
    mem = auto_budget.DeviceMemory(free + 1000 * per_cell * 2, "a test")
    plain = auto_budget.plan_cells(facts, mem, 64, 1).cells
    assert plain < facts.n_ctx_train  # the memory sets it, not the model's window
    less = auto_budget.plan_cells(facts, mem, 64, 1, besides=100 * per_cell).cells
    assert plain - less in (100, 101)
