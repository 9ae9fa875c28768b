"""What a policy sees and answers. The engine calls every policy through these hooks only.

Shapes use L = pot layers (model layers whose KV lives in the pot), H = KV heads,
N = cells currently in the pot. Every (layer, head) holds the same number of cells N;
which tokens those cells hold may differ per (layer, head).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError


@dataclass(frozen=True)
class TapRequest:
    """What the engine should measure while decoding the next chunk.

    tap_last: score-tap the last `tap_last` rows of the chunk (0: none; -1: every row).
    logprobs: return log p(next token) for every row of the chunk (InfiniPot's NuC).
    """

    tap_last: int = 0
    logprobs: bool = False


NO_TAPS = TapRequest()


@dataclass
class PotView:
    """The pot as a policy sees it when asked to choose."""

    n_layer: int
    n_head_kv: int
    n_cells: int
    # [L, H, N] int64: stream position (0-based index in everything read so far) of the token in each cell;
    # -1 marks catalyst cells (appended only to be tapped; a policy must never keep them)
    positions: np.ndarray
    # [L, H, N] float32 or None: attention mass each cell received from the tapped rows of the last chunk
    # (query heads of a group summed, tapped rows summed); None when nothing was tapped
    scores: np.ndarray | None
    # [n] float32 or None: log p(token | prefix) for the tokens of the last chunk, aligned with chunk_positions
    logprobs: np.ndarray | None
    # [n] int64: stream positions of the tokens of the last chunk
    chunk_positions: np.ndarray
    # tokens read so far (the next token's stream position)
    tokens_seen: int


class Policy:
    """Base: keeps everything. Subclasses are small dataclasses that override what they need.

    Hooks, in the order the engine calls them:
      set_question(text)         -> the question, when known before reading (InfiniPot's CaP-Q)
      set_expected_length(n)     -> tokens about to be read, when known (IMDC's number of chunks)
      cache_cells(budget, chunk) -> cells the context must hold (default budget + chunk)
      chunk_size(step, chunk)    -> tokens to read at step `step` (default: the configured chunk)
      before_chunk(n_tokens)     -> TapRequest for the chunk about to be decoded
      after_chunk(view)          -> observe the chunk's taps and log-probs (e.g. accumulate, H2O)
      wants_compaction(n_cells, budget, next_chunk) -> compact now? (default: n_cells > budget)
      catalyst_text()            -> text appended before select, its rows tapped, then dropped (CaP)
      budget_at(step, budget)    -> cells to keep after step `step` (default: the configured budget)
      select(view, budget)       -> int array [L, H, n] of cell indices to keep (each row sorted,
                                    no duplicates, no catalyst cell), or None to keep everything
      after_compaction(keep)     -> the engine moved cells: keep[l, h, j] is now cell j
      reset()                    -> forget the document
    """

    name = "base"
    # re-rotate kept keys so cell j sits at position j after each compaction (InfiniPot's CR-RoPE;
    # StreamingLLM's positions-within-the-cache); False keeps every token at its original position
    cr_rope = False

    def set_question(self, text: str) -> None:
        pass

    def set_expected_length(self, n_tokens: int) -> None:
        pass

    def cache_cells(self, budget: int, chunk: int) -> int:
        return budget + chunk

    def chunk_size(self, step: int, chunk: int) -> int:
        return chunk

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return NO_TAPS

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        return n_cells > budget

    def catalyst_text(self) -> str | None:
        return None

    def budget_at(self, step: int, budget: int) -> int:
        return budget

    def after_chunk(self, view: PotView) -> None:
        pass

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        return None

    def after_compaction(self, keep: np.ndarray) -> None:
        pass

    def reset(self) -> None:
        """Forget per-document state (the engine calls this on reset)."""

    def state_dict(self) -> dict:
        """Per-document state, for saved contexts: the dataclass fields declared with init=False
        (parameters are saved as the policy spec), and those of any policy this one wraps."""
        if not dataclasses.is_dataclass(self):
            return {}
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.init:
                out[f.name] = value
            elif isinstance(value, Policy):
                out[f.name] = {"wrapped": value.state_dict()}
        return out

    def load_state_dict(self, state: dict) -> None:
        fields = {f.name: f for f in dataclasses.fields(self)} if dataclasses.is_dataclass(self) else {}
        for name, value in state.items():
            f = fields.get(name)
            if f is None:
                raise KvpotError(f"saved state of {self.name} has an unknown field {name!r}")
            if f.init:
                getattr(self, name).load_state_dict(value["wrapped"])
            else:
                setattr(self, name, value)


def same_for_all_heads(cells: np.ndarray, n_layer: int, n_head_kv: int) -> np.ndarray:
    """Broadcast one sorted list of cell indices to [L, H, n]."""
    cells = np.sort(np.asarray(cells, dtype=np.int64))
    return np.broadcast_to(cells, (n_layer, n_head_kv, cells.size)).copy()


class BudgetTooSmall(KvpotError, ValueError):
    """The budget cannot hold what the policy always keeps (sinks, observation window, ...)."""


def keep_ends(positions: np.ndarray, n_first: int, n_last: int) -> np.ndarray:
    """Per (layer, head): the `n_first` cells with the smallest stream positions and the `n_last`
    with the largest, as cell indices [L, H, n_first + n_last], each row sorted ascending."""
    n = positions.shape[-1]
    if n_first < 0 or n_last < 0 or n_first + n_last > n:
        raise ValueError(f"cannot keep {n_first} first + {n_last} last of {n} cells")
    order = np.argsort(positions, axis=-1, kind="stable")
    cells = np.concatenate([order[..., :n_first], order[..., n - n_last:]], axis=-1)
    return np.sort(cells, axis=-1).astype(np.int64, copy=False)
