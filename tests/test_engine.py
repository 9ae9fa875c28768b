"""The Engine drives every policy through the same hooks; the pot stays bounded."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_model_facts
from kvpot.policies import H2O, FullAttention, SnapKV, StreamingLLM, Truncate

BUDGET, CHUNK = 192, 64

POLICIES = [
    pytest.param(lambda: StreamingLLM(), id="streaming"),
    pytest.param(lambda: StreamingLLM(n_sink=16), id="streaming-16"),
    pytest.param(lambda: Truncate(), id="truncate"),
    pytest.param(lambda: SnapKV(), id="snapkv"),
    pytest.param(lambda: SnapKV(window=16, kernel=7, pooling="maxpool"), id="snapkv-16-max"),
    pytest.param(lambda: H2O(), id="h2o"),
]


@pytest.fixture(scope="module")
def document():
    text, question, answer = logbook(n_entries=25, seed=2)
    return text, question


@pytest.mark.parametrize("make", POLICIES)
def test_every_policy_stays_in_budget_and_answers(smollm2_path, document, make):
    text, question = document
    eng = Engine(str(smollm2_path), make(), EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2))
    peaks = []
    eng.feed_text(text, on_chunk=lambda ev: peaks.append((ev.cells_peak, ev.cells, ev.stats.n_cells_used)))
    assert eng.tokens_seen > 3 * BUDGET
    assert max(p for p, _, _ in peaks) <= BUDGET + CHUNK
    assert all(c <= BUDGET and c == used for _, c, used in peaks)  # Python bookkeeping == the runtime's cells
    assert eng.n_compactions > 0
    # positions are those of tokens really read, unique per (layer, head)
    pos = eng.positions
    assert pos.max() < eng.tokens_seen
    assert all(len(np.unique(pos[l, h])) == pos.shape[2] for l in range(pos.shape[0]) for h in range(pos.shape[1]))
    answer = "".join(eng.answer(f"\nQuestion: {question}\nAnswer:", max_tokens=8))
    assert answer.strip()
    eng.close()


def test_streaming_keeps_sinks_and_recent(smollm2_path, document):
    text, _ = document
    eng = Engine(str(smollm2_path), StreamingLLM(n_sink=4), EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2))
    eng.feed_text(text)
    n = eng.tokens_seen
    kept = np.sort(eng.positions[0, 0])
    if eng.n_cells == BUDGET:  # the last chunk was followed by a compaction
        want = np.concatenate([np.arange(4), np.arange(n - (BUDGET - 4), n)])
        np.testing.assert_array_equal(kept, want)
    else:
        assert list(kept[:4]) == [0, 1, 2, 3] and kept[-1] == n - 1
    eng.close()


def test_reset_gives_the_same_result_as_a_fresh_engine(smollm2_cut_path, document):
    text, question = document
    cfg = EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2)
    eng = Engine(str(smollm2_cut_path), SnapKV(), cfg)
    eng.feed_text("Some other document that should be forgotten. " * 20)
    eng.reset()
    assert eng.n_cells == 0 and eng.stats().n_cells_used == 0 and eng.stats().n_compactions == 0
    eng.feed_text(text)
    after_reset = eng.next_logits(f"\nQuestion: {question}\nAnswer:")
    fresh = Engine(str(smollm2_cut_path), SnapKV(), cfg)
    fresh.feed_text(text)
    want = fresh.next_logits(f"\nQuestion: {question}\nAnswer:")
    np.testing.assert_allclose(after_reset, want, atol=1e-4)
    eng.close()
    fresh.close()


def test_full_attention_refuses_past_the_context(smollm2_path, document):
    text, _ = document
    eng = Engine(str(smollm2_path), FullAttention(), EngineConfig(budget=192, chunk=CHUNK, n_ctx=256, n_threads=2))
    with pytest.raises(KvpotError, match="full keeps every token: .* do not fit the context of 256 cells"):
        eng.feed_text(text)
    eng.close()


def test_impossible_budgets_are_refused(smollm2_path):
    with pytest.raises(KvpotError, match="must be positive"):
        Engine(str(smollm2_path), StreamingLLM(), EngineConfig(budget=0, chunk=CHUNK))
    with pytest.raises(KvpotError, match="cannot hold budget"):
        Engine(str(smollm2_path), StreamingLLM(), EngineConfig(budget=512, chunk=512, n_ctx=600))


def test_bad_model_never_reaches_llama_cpp(tmp_path):
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")  # a header cut short
    with pytest.raises(KvpotError, match="truncated"):
        Engine(str(bad), StreamingLLM())


# tokens the bounded-memory check reads: 8K in the suite (14 compactions at 1,024 cells: every one after
# the second chunk, so more tokens add time, not cases); `make test-long` reads 64K
LONG_TOKENS = int(os.environ.get("KVPOT_LONG_TOKENS", 8 * 1024))


# `make test`'s 8K read takes the cut models (SmolLM2 to 4 blocks, Gemma-3 to 6: the same cells in each
# layer, window layers included, read several times faster); `make test-long` reads its 64K through both
# whole models
LONG_WHOLE = LONG_TOKENS > 8 * 1024


@pytest.mark.slow
@pytest.mark.parametrize("model_fixture", ["smollm2_path" if LONG_WHOLE else "smollm2_cut_path",
                                           "gemma_path" if LONG_WHOLE else "gemma_cut_path"])
def test_a_long_input_with_1024_cells_stays_bounded(request, model_fixture):
    """Over LONG_TOKENS tokens the pot never holds more than budget + one chunk (both test models)."""
    path = request.getfixturevalue(model_fixture)
    budget, chunk = 1024, 512
    eng = Engine(str(path), StreamingLLM(), EngineConfig(budget=budget, chunk=chunk, n_threads=2))
    rng = np.random.default_rng(0)
    tokens = rng.integers(1000, 20000, LONG_TOKENS).tolist()
    peaks, swa = [], []
    eng.feed(tokens, on_chunk=lambda ev: (peaks.append(ev.cells_peak), swa.append(ev.stats.n_swa_used)))
    assert eng.tokens_seen == LONG_TOKENS + len(eng.model.bos())  # + BOS where the model adds one
    assert max(peaks) <= budget + chunk
    assert max(peaks) > budget  # it did fill up and compact, every chunk
    assert eng.stats().bytes_used <= eng.stats().bytes_total
    if swa[0] >= 0:  # Gemma: the window part stays bounded by itself
        assert max(swa) <= 512 + 2 * chunk
    eng.close()


def test_pot_refuses_calls_after_close(smollm2_path):
    """The pot holds the context wrapper: after close, a call is one clear error, not freed memory."""
    from kvpot.policies import StreamingLLM

    with Engine(str(smollm2_path), StreamingLLM(), EngineConfig(budget=64, chunk=32, n_threads=2)) as eng:
        pot = eng.pot
        assert pot.stats().n_cells_used == 0
    with pytest.raises(KvpotError, match="context is closed"):
        pot.stats()
    with pytest.raises(KvpotError, match="context is closed"):
        pot.compact(np.zeros((pot.n_layers, pot.n_head_kv, 1), dtype=np.int64), cr_rope=False)


def test_a_small_pot_on_a_sliding_window_model_reads_past_the_window(gemma_path, document):
    """Gemma-3's window layers need window + chunk cells; a pot of 64 cells with 32-token chunks would
    size the context below that (352 cells, 512 after llama.cpp's rounding) and stop at position 512."""
    facts = read_model_facts(gemma_path)
    eng = Engine(str(gemma_path), StreamingLLM(), EngineConfig(budget=64, chunk=32))
    try:
        assert eng.ctx.n_ctx >= facts.sliding_window + 32
        toks = eng.model.tokenize(document[0])[:facts.sliding_window + 200]
        assert len(toks) > facts.sliding_window + 64
        eng.feed(toks)
        assert eng.tokens_seen >= len(toks) and eng.n_cells <= 64 + 32  # (+ the BOS)
    finally:
        eng.close()
