"""Rows of logits a kvpot context asks llama.cpp to hold (llama_context_params.n_outputs_max).

llama.cpp reserves its compute buffer for the output head on n_outputs_max rows of a step, n_batch when
left at 0: 512 x n_vocab x 4 bytes (512 MiB for Gemma 3's 262,144-token vocabulary) that kvpot never uses, as it
marks only the last row of a step for logits. NuC's per-row log-probs (InfiniPot) run the head inside the
graph on one block of rows at a time (ggml_ext/kvpot-logprobs.cpp) beside the marked row, so a context
that scores rows reserves that block plus the marked row, and the buffer is sized once, at creation.
"""

from __future__ import annotations

# ggml_ext/kvpot-logprobs.cpp: the output head runs on blocks of at least LP_BLOCK_ROWS rows, in at most
# LP_MAX_BLOCKS blocks per step
LOGPROB_BLOCK_ROWS = 64
LOGPROB_BLOCKS = 16
# rows a kvpot decode marks for logits: the last one (the next token's distribution)
MARKED_ROWS = 1


def logprob_block_rows(n_rows: int) -> int:
    """Rows of the largest block NuC's head runs on in a step of `n_rows` rows."""
    return min(n_rows, max(LOGPROB_BLOCK_ROWS, -(-n_rows // LOGPROB_BLOCKS)))


def outputs_max(n_batch: int, logprobs: bool, marked: int = MARKED_ROWS) -> int:
    """n_outputs_max for a context that decodes steps of up to `n_batch` rows and marks `marked` of them;
    `logprobs`: its steps may ask for every row's log-prob (NuC), whose block of rows the head runs on
    next to the marked rows."""
    rows = marked + (logprob_block_rows(n_batch) if logprobs else 0)
    return max(1, min(n_batch, rows))
