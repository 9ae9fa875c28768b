"""What a policy sees and answers: a small core every policy has, and the capabilities some declare.

Shapes use L = pot layers (model layers whose KV lives in the pot), H = KV heads,
N = cells currently in the pot. Every (layer, head) has the same N cells; which tokens those
cells hold may differ per (layer, head), and after a compaction with per-layer budgets (IMDC's
adaptive and square-sqrt schedules) a layer may hold fewer: its other cells are DEAD there
(masked out of that layer's attention) until the next compaction frees them.

Why the split. The engine's reading loop asks every policy the same few things at every chunk:
how many tokens to read, what to tap, when to compact, how many cells to keep and which, and what
to forget or save. Those are `Policy`, the core, and every method answers them (the defaults keep
everything). Every other question concerns a part that one or two methods have and the rest do not;
each such part is a capability, a small class a policy declares by subclassing, whose defaults say
"not here":

  QuestionFirst   what it keeps depends on the question when it is known before reading (InfiniPot's
                  CaP-Q): `kvpot chat`, which reads before any question, says so
  Catalyst        text decoded after the pot and tapped before each selection, then dropped (CaP)
  LengthAware     plans its steps by the input's length (IMDC's schedule)
  GraphPieces     pieces it runs inside llama.cpp's graph: trained weights handed to the pot once
                  (Locret's retaining heads, EdgeInfinite's memory gate, both checked before the
                  model loads), cells folded into the gated memory before a compaction, every row's
                  log-prob (InfiniPot's NuC, which sizes llama.cpp's output rows)
  ExternalMemory  a memory outside the pot with a file on disk (InfLLM's block store): cells
                  recalled after each compaction and the store the graph's lookup reads, a question
                  looked up before it is read, the disk it needs before reading and uses after, the
                  file kept when a saved context references it, its caches' counts

The engine, the session and the checks ask a capability of a policy with `Cap.of(policy)`, which
answers with the policy's part that has it, or with the capability's defaults (nothing to recall,
no disk, no catalyst, ...), and `Cap.held_by(policy)` where the question is yes or no. They never
ask which policy they hold.

Cross-cutting behaviour is a wrapper, in the manner of kvpress's presses around a press
(`kvpot.policies.wrappers`: `KeyRerotation`, CR-RoPE after every compaction whatever the wrapped
policy keeps; `PerLayerBudgets`, a per-(layer, head) policy run one layer at a time with a budget
per layer). A `Wrapping` forwards every core hook to the policy it wraps and overrides only what
it changes; capabilities are found through wrappers, so a wrapper that changes one declares it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from kvpot.errors import KvpotError

# PotView.positions markers: a catalyst cell (appended to be tapped, never kept) and a cell the
# layer no longer holds (per-layer budgets: masked out of that layer's attention, never kept)
CATALYST = -1
DEAD = -2
# keep-list padding: a row of a layer that keeps fewer cells than the longest row ends with PAD
PAD = -1


@dataclass(frozen=True)
class TapRequest:
    """What the engine should measure while decoding the next chunk.

    tap_last: score-tap the last `tap_last` rows of the chunk (0: none; -1: every row).
    tap_what: what the tap sums over those rows, per cell and KV head: "attention" (the probability the
              cell receives) or "logits" (the attention logit q·k it receives, before softmax: one
              product per cell, no [cells x rows] matrix; InfLLM's r_m).
    logprobs: return log p(next token) for every row of the chunk (InfiniPot's NuC).
    head_scores: return the retaining heads' score of every token of the chunk (Locret); the
                 policy brings the heads through its `retaining_heads` hook.
    query_angle: capture each pot layer's lookup query of the chunk (its queries re-rotated to this
                 RoPE position, summed over rows and the query heads of each KV group; InfLLM); None: no
    """

    tap_last: int = 0
    tap_what: str = "attention"
    logprobs: bool = False
    head_scores: bool = False
    query_angle: int | None = None


NO_TAPS = TapRequest()


@dataclass
class PotView:
    """The pot as a policy sees it when asked to choose."""

    n_layer: int
    n_head_kv: int
    n_cells: int
    # [L, H, N] int64: stream position (0-based index in everything read so far) of the token in each cell;
    # CATALYST (-1) marks catalyst cells (appended only to be tapped), DEAD (-2) cells a layer no longer
    # holds (per-layer budgets); a policy must never keep either
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
    # [L, H, n] float32 or None: the retaining heads' score of each token of the last chunk (Locret),
    # aligned with chunk_positions; None unless the policy asked for them
    head_scores: np.ndarray | None = None
    # [L, H, d_k] float32 or None: the chunk's lookup query per pot layer (TapRequest.query_angle)
    queries: np.ndarray | None = None
    # read_cells(cell0, n, rope_to) -> (k [L, H, n, d_k] re-rotated to RoPE position rope_to, v [L, H, n, d_v]):
    # the K/V of cells [cell0, cell0 + n) of every pot layer; None when no runtime is behind the view
    read_cells: Callable[[int, int, int], tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class Recall:
    """Cells a policy puts back after a compaction (InfLLM's initial tokens and retrieved blocks): the
    engine appends them after the kept cells, every key re-rotated to one RoPE position."""

    k: np.ndarray          # [L, H, m, d_k] float32, keys stored at RoPE positions rope_from
    v: np.ndarray          # [L, H, m, d_v] float32
    rope_from: np.ndarray  # [m] int32
    rope_to: int
    positions: np.ndarray  # [L, H, m] int64 stream positions of the recalled tokens
    fetch: Fetch | None = None  # recalled cells the graph refills for every ubatch, if any
    # every query sees the recalled cells this many positions back, whatever its own position (InfLLM's
    # memory "at distance n_local"; kvpot_distance_set), or None: at the RoPE position rope_to
    distance: int | None = None


@dataclass(frozen=True)
class Fetch:
    """Recalled cells that every later ubatch's graph fills itself (InfLLM's lookup inside the layer):
    per pot layer, the n_blocks blocks of the policy's `lookup_store()` most relevant to that ubatch's
    own queries, written over recalled cells first .. first + n_blocks * block_size - 1 before the
    layer's attention. Until a decode fills them they hold zeros (the recall's k/v there are
    placeholders) and `positions` a guess; the engine books the tokens each decode fetched."""

    first: int        # index, within the recalled cells, of the first cell the graph fills
    n_blocks: int
    block_size: int
    n_local: int      # queries scored at RoPE angle n_local; keys placed n_local before the ubatch


def _fits_once(fit):
    """`fit` that remembers the (budget, chunk) it last succeeded for and returns at once when asked
    again for the same: the session fits the policy before the model loads, and the engine's own call
    then finds it fitted. A fit that raises leaves the policy unfitted, so a retry runs it again."""
    if getattr(fit, "fits_once", False):
        return fit

    @functools.wraps(fit)
    def fitted(self, budget: int, chunk: int) -> None:
        if getattr(self, "_fitted_for", None) == (budget, chunk):
            return
        object.__setattr__(self, "_fitted_for", None)
        try:
            fit(self, budget, chunk)
        except BaseException:
            object.__setattr__(self, "_fitted_for", None)  # a super().fit inside may have set it
            raise
        object.__setattr__(self, "_fitted_for", (budget, chunk))

    fitted.fits_once = True
    return fitted


def _refits_after_gate(memory_gate):
    """`memory_gate` that makes the next `fit` run again when it returns a gate: EdgeInfinite learns
    its memory's size there, and that memory counts against the budget fit shares out."""
    if getattr(memory_gate, "refits", False):
        return memory_gate

    @functools.wraps(memory_gate)
    def gated(self, model_path, shipped=None):
        gate = memory_gate(self, model_path, shipped)
        if gate is not None:
            object.__setattr__(self, "_fitted_for", None)
        return gate

    gated.refits = True
    return gated


class Policy:
    """The core every policy answers: keeps everything unless a subclass says otherwise. Subclasses
    are small dataclasses that override what they need and declare the capabilities they have.

    Before anything loads, where settings are validated:
      check_budget(budget)       -> raise BudgetTooSmall when the budget can never work (SnapKV's window,
                                    StreamingLLM's sinks, ...); select calls it too
    Hooks, in the order the engine calls them:
      fit(budget, chunk)         -> before anything else: the user's --budget and --chunk, mapped
                                    onto the policy's own sizes that its spec left open (None);
                                    BudgetTooSmall when the budget cannot work. A policy remembers the
                                    (budget, chunk) it was fitted for: fitting it again with the same
                                    does nothing (every subclass's fit is wrapped so), so the session
                                    fits it before the model loads and the engine's call is free;
                                    a memory_gate that returns a gate makes the next fit run again
      cache_cells(budget, chunk) -> the most cells the pot ever holds while reading (default budget +
                                    chunk: the budget kept, and the chunk being read)
      chunk_size(step, chunk)    -> tokens to read at step `step` (default: the configured chunk)
      before_chunk(n_tokens)     -> TapRequest for the chunk about to be decoded
      after_chunk(view)          -> observe the chunk's taps and log-probs (e.g. accumulate, H2O)
      budget_at(step, budget)    -> cells to keep after step `step` (default: the configured budget);
                                    an int, or an int array [L] for a different budget per pot layer
      wants_compaction(n_cells, budget, next_chunk) -> compact now? (default: n_cells > budget)
      select(view, budget)       -> int array [L, H, n] of cell indices to keep (each row sorted,
                                    no duplicates, no catalyst or dead cell), or None to keep
                                    everything; a layer that keeps fewer than n cells ends each of
                                    its rows with PAD (the same count in every head of the layer)
      after_compaction(keep)     -> the engine moved cells: keep[l, h, j] is now cell j
      reset()                    -> forget the document
    Any time:
      sink_tokens()              -> the stream's first tokens it keeps as attention sinks
      state_dict() / load_state_dict(state) -> per-document state, for saved contexts
      cr_rope                    -> whether kept keys are re-rotated to 0..n-1 after each compaction
    """

    name = "base"
    # re-rotate kept keys so cell j sits at position j after each compaction (InfiniPot's CR-RoPE;
    # StreamingLLM's positions-within-the-cache); False keeps every token at its original position.
    # A policy's own choice is a dataclass field `cr_rope: bool = ...` (a parameter of the spec, e.g.
    # infinipot:cr_rope=0); around any policy, KeyRerotation (kvpot.policies.wrappers) sets it
    cr_rope = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # every subclass's own fit remembers what it was fitted for, and its own memory_gate forgets it
        # when it returns a gate (_fits_once, _refits_after_gate): no policy file has to do either
        if "fit" in cls.__dict__:
            cls.fit = _fits_once(cls.__dict__["fit"])
        if "memory_gate" in cls.__dict__:
            cls.memory_gate = _refits_after_gate(cls.__dict__["memory_gate"])

    @_fits_once
    def fit(self, budget: int, chunk: int) -> None:
        """Take the user's --budget (cells the pot may hold) and --chunk (tokens per step). A policy
        maps them onto its own sizes where its spec left them open, and refuses a budget it cannot
        honour with one line (BudgetTooSmall). Called again with the same budget and chunk, it
        returns at once: a policy is fitted once per session, before the model loads."""
        self.check_budget(budget)

    def check_budget(self, budget: int) -> None:
        """Raise BudgetTooSmall (one line; `least`: the smallest budget that works, when one does) when
        `select` cannot keep `budget` cells (e.g. fewer than its sinks). `fit` calls it before the model
        loads; a wrapper asks its wrapped policy this for each size it will give it."""
        if budget < 1:
            raise BudgetTooSmall(f"{self.name} needs a budget of at least 1 cell, got {budget}", least=1)

    def cache_cells(self, budget: int, chunk: int) -> int:
        return budget + chunk

    def chunk_size(self, step: int, chunk: int) -> int:
        return chunk

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return NO_TAPS

    def after_chunk(self, view: PotView) -> None:
        pass

    def budget_at(self, step: int, budget: int) -> int:
        return budget

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        return n_cells > budget

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        return None

    def after_compaction(self, keep: np.ndarray) -> None:
        pass

    def sink_tokens(self) -> int:
        """The stream's first tokens this policy keeps as attention sinks whatever they say (StreamingLLM's
        n_sink, InfLLM's initial tokens): every query attends to them, so they never tell where an
        answer comes from (kvpot.locator.sources leaves them out)."""
        return 0

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


# -- capabilities: what some policies have and most do not ----------------------------------------

C = TypeVar("C", bound="Capability")


class Capability:
    """An optional part of a policy, declared by subclassing (`class InfLLM(Policy, ExternalMemory)`).
    Its methods' bodies are the defaults a policy without it answers with."""

    @classmethod
    def of(cls: type[C], policy: Policy) -> C:
        """The part of `policy` that has this capability: the policy itself, or the nearest policy it
        wraps that has it (a wrapper that changes a capability declares it itself); else this
        capability's defaults, which do nothing."""
        found = _find(policy, cls)
        return found if found is not None else _absent(cls)

    @classmethod
    def held_by(cls, policy: Policy) -> bool:
        """Whether `policy`, or a policy it wraps, has this capability."""
        return _find(policy, cls) is not None


def _find(policy, cap: type[C]) -> C | None:
    while policy is not None:
        if isinstance(policy, cap):
            return policy
        policy = policy.wrapped if isinstance(policy, Wrapping) else None
    return None


@functools.cache
def _absent(cap: type[C]) -> C:
    return cap()


class QuestionFirst(Capability):
    """What the policy keeps depends on the question when it is known before reading (InfiniPot's
    CaP-Q): a read without it (`kvpot chat`) keeps what no question chose."""

    def set_question(self, text: str) -> None:
        """The question, told before reading."""


class Catalyst(Capability):
    """Text the engine decodes after the pot before each selection, taps (its rows' attention is
    the view's scores), then drops (InfiniPot's CaP). The engine leaves room for it in every chunk."""

    def catalyst_text(self) -> str | None:
        return None


class LengthAware(Capability):
    """Plans its steps by the input's length (IMDC's number of chunks)."""

    def set_expected_length(self, n_tokens: int) -> None:
        """Tokens about to be read, when known or estimated (before reading, and as reading starts)."""


class GraphPieces(Capability):
    """Pieces the policy runs inside llama.cpp's graph.

    A policy with a trained adapter names its kind (`adapter_kind`, as models/registry.py lists the
    shipped ones); the layer that knows the model file (the engine, the checks before it loads) looks up
    the adapter shipped for that model and hands its path in as `shipped`, used where the spec names no
    file. Policies never look up models themselves, so models/ stays a leaf."""

    adapter_kind: str | None = None  # "locret", "edgeinfinite": the kind of adapter shipped for models

    def retaining_heads(self, model_path, shipped=None):
        """Trained retaining heads (Locret's), checked against the model, or None; handed to the pot once.
        shipped: the heads shipped for this model, if any."""
        return None

    def memory_gate(self, model_path, shipped=None):
        """EdgeInfinite's memory-gating module, checked against the model, or None; asked before fit
        and before the cache is sized (the memory counts against the budget). shipped: the gate shipped
        for this model, if any."""
        return None

    def memory_fold(self) -> np.ndarray | None:
        """Cells (the same in every layer and head) to fold into the gated memory before the compaction
        select just chose, or None."""
        return None

    def wants_logprobs(self) -> bool:
        """Whether its chunks ask for every row's log-prob (TapRequest.logprobs, NuC), answered without
        side effects before reading: the engine sizes llama.cpp's output rows and the planner their
        memory from it."""
        return False


class ExternalMemory(Capability):
    """A memory outside the pot (InfLLM's block store, a file on disk)."""

    def recall(self, pos_next: int) -> Recall | None:
        """Cells appended after the kept ones after a compaction, or None; with Recall.fetch, part of
        them the graph refills per ubatch from `lookup_store()`."""
        return None

    def lookup_store(self):
        """The open block store the graph's lookup reads (kvpot.runtime.blocks), or None."""
        return None

    def before_prompt(self, n_tokens: int) -> TapRequest:
        """TapRequest for a question about to be decoded: with query_angle set, the engine decodes it
        once to capture its queries, takes it back out, lets the policy select (view.queries) and
        recall, then decodes it for real (InfLLM's lookup for the question)."""
        return NO_TAPS

    def disk_need(self, facts, n_tokens: int):
        """(bytes, folder, how to write less or elsewhere) written to disk reading n_tokens of a model
        with these ModelFacts, or None; asked before reading so a read that would fill the disk is
        refused up front."""
        return None

    def disk_bytes(self) -> int:
        """Bytes kept on disk beside the pot now."""
        return 0

    def keep_on_disk(self) -> None:
        """A saved context file now references the data on disk: never delete it."""

    def cache_stats(self) -> dict | None:
        """What the memory's own caches did (InfLLM's per-layer block caches: rule, size, hits and
        misses per layer), or None."""
        return None


class BudgetTooSmall(KvpotError, ValueError):
    """The budget cannot hold what the policy always keeps (sinks, observation window, ...).
    `least`: the smallest budget that works with the policy's parameters (None: no budget helps,
    another parameter must change)."""

    def __init__(self, message: str, least: int | None = None):
        super().__init__(message)
        self.least = least


def keep_ends(positions: np.ndarray, n_first: int, n_last: int) -> np.ndarray:
    """Per (layer, head): the `n_first` cells with the smallest stream positions and the `n_last`
    with the largest, as cell indices [L, H, n_first + n_last], each row sorted ascending."""
    n = positions.shape[-1]
    if n_first < 0 or n_last < 0 or n_first + n_last > n:
        raise ValueError(f"cannot keep {n_first} first + {n_last} last of {n} cells")
    order = np.argsort(positions, axis=-1, kind="stable")
    cells = np.concatenate([order[..., :n_first], order[..., n - n_last:]], axis=-1)
    return np.sort(cells, axis=-1).astype(np.int64, copy=False)


def keep_top_and_recent(positions: np.ndarray, n_top: int, n_recent: int, rank_older) -> np.ndarray:
    """Per (layer, head): the `n_recent` newest cells, plus the `n_top` older cells that
    `rank_older(older)` scores highest (ties go to the older cell). `older` is [L, H, n_older]: the
    cell indices of the other cells in stream order; rank_older returns their scores, same shape.
    The selection SnapKV (pooled votes) and H2O (accumulated attention) share."""
    n = positions.shape[-1]
    n_older = n - n_recent
    if n_top < 0 or n_recent < 0 or n_top > n_older:
        raise ValueError(f"cannot keep {n_top} older + {n_recent} recent of {n} cells")
    order = np.argsort(positions, axis=-1, kind="stable")  # cells in stream order
    older = order[..., :n_older]
    top = np.argsort(-np.asarray(rank_older(older)), axis=-1, kind="stable")[..., :n_top]
    kept = np.concatenate([np.take_along_axis(older, top, axis=-1), order[..., n_older:]], axis=-1)
    return np.sort(kept, axis=-1).astype(np.int64, copy=False)



# the core hooks a Wrapping hands to the policy it wraps unless it overrides them (state_dict and
# load_state_dict follow the wrapped policy through its dataclass field; capabilities through _find)
FORWARDED = ("check_budget", "fit", "cache_cells", "chunk_size", "before_chunk", "after_chunk", "budget_at",
             "wants_compaction", "select", "after_compaction", "sink_tokens", "reset")


class Wrapping(Policy):
    """A policy around another one (kvpress's presses around a press: ChunkPress, KeyRerotationPress):
    every core hook goes to the wrapped policy unless the wrapper overrides it, so a wrapper states
    only what it changes. The wrapped policy's capabilities are found through it (`Capability.of`);
    a wrapper that changes one declares it and calls the wrapped policy's part itself."""

    @property
    def wrapped(self) -> Policy:
        raise NotImplementedError

    @property
    def cr_rope(self) -> bool:  # type: ignore[override]
        return self.wrapped.cr_rope


def _forwarding(hook: str):
    def forward(self, *args):
        return getattr(self.wrapped, hook)(*args)

    forward.__name__ = forward.__qualname__ = hook
    forward.__doc__ = f"The wrapped policy's `{hook}`."
    return forward


for _hook in FORWARDED:
    setattr(Wrapping, _hook, _forwarding(_hook))


def check_keep(keep: np.ndarray, positions: np.ndarray, who: str) -> np.ndarray:
    """Validate a keep list [L, H, n] against the pot's positions [L, H, N] before the runtime sees
    it; returns the number of cells each layer keeps, [L]."""
    keep = np.asarray(keep)
    L, H, N = positions.shape
    if keep.ndim != 3 or keep.shape[:2] != (L, H) or not 1 <= keep.shape[2] <= N:
        raise KvpotError(f"internal: {who} returned a keep list of shape {keep.shape} for a pot of {L}x{H}x{N}")
    held = keep != PAD
    n_live = held.sum(axis=2)
    if np.any(n_live != n_live[:, :1]) or np.any(n_live == 0):
        raise KvpotError(f"internal: {who} kept a different number of cells in the heads of one layer, or none")
    if np.any(held != (np.arange(keep.shape[2]) < n_live[..., None])):
        raise KvpotError(f"internal: {who} padded a keep row before its end")
    cells = np.where(held, keep, 0)
    if np.any((cells < 0) | (cells >= N)):
        raise KvpotError(f"internal: {who} kept a cell outside the pot")
    if np.any(held & (np.take_along_axis(positions, cells, axis=2) < 0)):
        raise KvpotError(f"internal: {who} kept a catalyst or dead cell")
    return n_live[:, 0]

