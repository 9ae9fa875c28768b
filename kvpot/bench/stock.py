"""What stock llama.cpp does with a document, run on kvpot's patched runtime with no kvpot call: one
context holding every token, prefilled in n_batch steps, flash attention off unless asked. The accuracy
grids' full-attention reference, and in the speed and memory benchmarks the column shown beside the
reference, which is unpatched llama.cpp at its own defaults (kvpot.bench.stock_upstream)."""

from __future__ import annotations

from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel


def stock_context(model: LlamaModel, n_ctx: int, chunk: int, threads: int, flash_attn: bool = False) -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=chunk, n_threads=threads, flash_attn=flash_attn))


def prefill(ctx: LlamaContext, tokens: list[int], chunk: int, start: int = 0) -> None:
    """Decode `tokens` from position `start` in steps of `chunk` (n_batch), logits of the last row only."""
    for s in range(0, len(tokens), chunk):
        ctx.decode(tokens[s:s + chunk], start + s, logits="last")
