"""NuC's per-row log-probs with the output head run a block of rows at a time (ggml_ext/kvpot-logprobs.cpp),
on each architecture kvpot ships a model for: llama (SmolLM2, tied head), gemma3 (262,144-token vocabulary)
and qwen2 (Qwen2.5-Coder-0.5B).

The reference is stock llama.cpp in the same run: a context that marks every row for logits, whose
log_softmax gives each row's log p(next). The pot's context marks only the last row and asks for the
log-probs; the graph must then compute no [n_vocab, n_rows] tensor (the memory NuC used to cost: 512 MiB
per 512-row chunk on Gemma), which a cb_eval shape recorder checks on the same graph where it does see
that tensor in stock's all-rows run.
"""

from __future__ import annotations

import numpy as np
import pytest
from potlib import ShapeRecorder, log_softmax_rows, logbook_tokens, pot_logprobs

from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.pot import Pot

CHUNK = 160  # three blocks of rows: two full ones of 64 and one of 32
BLOCK_ROWS = 64  # kvpot-logprobs.cpp LP_BLOCK_ROWS
N_CTX = 512


def _ctx(model, recorder: ShapeRecorder | None = None) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2),
                        cb_eval=recorder.callback if recorder else None)


@pytest.mark.parametrize("name", ["smol", "gemma", "qwen05"])
def test_blocked_head_logprobs_equal_stock_log_softmax(name, request):
    model = request.getfixturevalue(name)
    toks = logbook_tokens(model, 12, 5, CHUNK + 1)
    batch, targets = toks[:CHUNK], toks[1:CHUNK + 1]
    n_vocab = model.n_vocab

    stock_shapes = ShapeRecorder()
    ref = _ctx(model, stock_shapes)
    ref.decode(batch, 0, logits="all")
    want = log_softmax_rows(ref, CHUNK)[np.arange(CHUNK), targets]
    ref_last = ref.logits_last()
    ref.close()
    # the recorder sees the full-size logits where they exist
    assert (n_vocab, CHUNK, 1, 1) in stock_shapes.shapes

    shapes = ShapeRecorder()
    got, last = pot_logprobs(_ctx(model, shapes), batch, targets)

    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-3)
    np.testing.assert_allclose(last, ref_last, atol=2e-3, rtol=1e-4)
    vocab_rows = sorted({s[1] for s in shapes.shapes if s[0] == n_vocab})
    # the head on the marked row, then blocks of 64, 64 and 32 rows: nothing the size of the chunk
    assert vocab_rows == [1, CHUNK - 2 * BLOCK_ROWS, BLOCK_ROWS], vocab_rows


def test_a_ubatch_without_targets_keeps_the_stock_head(smol):
    """Rows outside the request (a later decode, the answer's tokens) leave the graph as llama.cpp builds
    it: the head is rebuilt only where log-probs are wanted."""
    toks = logbook_tokens(smol, 12, 5, 2 * CHUNK)
    shapes = ShapeRecorder()
    ctx = _ctx(smol, shapes)
    pot = Pot(ctx)
    pot.logprobs_request(0, toks[1:CHUNK + 1])
    ctx.decode(toks[:CHUNK], 0, logits="last")
    shapes.shapes.clear()
    ctx.decode(toks[CHUNK:CHUNK + 8], CHUNK, logits="all")  # no requested position in this batch
    pot.logprobs_clear()
    ctx.close()
    assert (smol.n_vocab, 8, 1, 1) in shapes.shapes
