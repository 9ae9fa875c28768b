"""A method's part removed, the pot reset, then a decode: the next graph must be built anew, since
llama.cpp's last one still holds the part's nodes and its freed weights. Used by
test_pot_reset_graph.py in a subprocess, so that a crash (a reused graph reading freed memory) fails
that test instead of killing pytest. Prints the largest difference between the logits after the reset
and those of a fresh context that never had the part.

    python reset_worker.py MODEL_PATH PART      PART: heads | capture | gate
"""

from __future__ import annotations

import sys

import numpy as np
from test_memory_gate import random_gate
from test_retaining_heads import random_heads

from kvpot.bench.logbook import logbook
from kvpot.converters.adapter import BaseIdentity
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot


def logits_after(model: LlamaModel, tokens: list[int], part: str | None, base: BaseIdentity) -> np.ndarray:
    ctx = LlamaContext(model, ContextParams(n_ctx=256, n_batch=64, n_threads=1))
    try:
        pot = Pot(ctx)
        if part is not None:
            if part == "heads":
                pot.set_heads(random_heads(base, "silu"))
            elif part == "capture":
                pot.capture(True)
            else:
                pot.set_gate(random_gate(pot.layer_ids, base.head_dim_v, base.n_head, seed=3))
            ctx.decode(tokens, 0, logits="last")  # the graph now holds the part's nodes
            if part == "heads":
                pot.set_heads(None)
            elif part == "capture":
                pot.capture(False)
            else:
                pot.set_gate(None)
            ctx.clear()
            pot.reset()
        ctx.decode(tokens, 0, logits="last")
        return ctx.logits_last().copy()
    finally:
        ctx.close()


def main(model_path: str, part: str) -> None:
    base = BaseIdentity.of_model(model_path)
    model = LlamaModel(model_path)
    try:
        tokens = model.tokenize(logbook(n_entries=3, seed=1)[0])[:64]
        after = logits_after(model, tokens, part, base)
        fresh = logits_after(model, tokens, None, base)
        print(float(np.abs(after - fresh).max()))
    finally:
        model.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
