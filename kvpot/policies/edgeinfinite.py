"""EdgeInfinite: sink + window tokens in the KV cache, whole segments folded into a gated compressive memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.converters.adapter import MemoryGate, initial_memory_gate, read_memory_gate
from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, GraphPieces, Policy, PotView

# the paper's defaults (section 4.1) and their ratio, used to scale unset lengths to a budget
PAPER_SINK, PAPER_WINDOW, PAPER_SEG = 300, 200, 2048
# bytes per K or V element the budget counts a cell at (kvpot's default f16 cache)
CELL_ELEM_BYTES = 2
# gate=closed: sigmoid(-30) = 9e-14, so the memory's share is below f32 rounding of the attention output
CLOSED_G = -30.0


@dataclass
class EdgeInfinite(Policy, GraphPieces):
    """EdgeInfinite (Chen et al. 2025, "EdgeInfinite: A Memory-Efficient Infinite-Context Transformer for
    Edge Devices", section 3.2 and Algorithm 1) on the pot.

    gate:     the memory-gating adapter GGUF (adapter.type = kvpot.memory_gate, `kvpot train edgeinfinite`),
              checked against the model; "init" runs the untrained gate (the ablation); "closed" the
              untrained gate shut (g = CLOSED_G on every channel: EdgeInfinite's eviction alone, the
              memory still folded and read but mixed in at ~1e-13); empty: the gate shipped for a known
              model (models/: SmolLM2-135M and Gemma-3-270M)
    L_sink:   sink tokens kept in the cache (paper: 300)
    L_window: most recent tokens kept in the cache (paper: 200)
    L_seg:    segment length: whenever the tokens past the sink, less the window, reach L_seg, whole
              segments of L_seg are folded into the memory (M += sigma(K)^T V, z += sum sigma(k)) and leave
              the cache (paper: 2048)
    Left unset (None), fit(budget, chunk) takes the paper's values when they and the memory (M and z in
    f32, counted in f16 KV cells) fit the budget; else the sink takes the paper's share (300 of 2548)
    of what the budget leaves after the memory, segments are one cell and the window takes the rest.
    For kvpot's default budget of 1024 cells on SmolLM2 (memory: 65 cells) that is L_sink 112,
    L_window 846, L_seg 1; on Gemma-3 (257 cells) 90 / 676 / 1. Why one cell: a fold leaves sink + window
    + r cells, r in [0, L_seg) fixed by the stream's arithmetic, and the window is what the budget leaves
    after sink and segment, so every cell of segment costs a cell of KV: with segments of one every chunk
    reads with budget - memory - 1 cells, what StreamingLLM at the same KV budget keeps less one (the
    perplexities by segment length: docs/edgeinfinite.md, "Budget"). Folds add (M is a sum over tokens),
    so the segment length changes only how many cells stay, not what the memory holds, and kvpot folds at
    chunk boundaries whatever it is, so shorter segments cost no speed. (Scaling all three in the paper's ratio, 112 / 75 / 772, would
    leave up to 187 cells after each fold; docs/edgeinfinite.md "Budget".)

    Routing (section 3.2.2): while the text fits the budget nothing is folded and the memory is None, so
    attention is the stock computation (with fit's lengths the budget is L_sink + L_window + L_seg plus
    the memory, the paper's threshold). Past it, whole segments of L_seg are folded, per layer and KV
    head the oldest cells after the sink, until the cache fits the budget less the memory: KV cells + M, z
    never exceed the budget after a step (the chunk being read comes on top, as for every policy).
    Decisions (the paper leaves them open or assumes one long forward):
      * kvpot reads in chunks: a chunk's tokens attend to the sink, every cell not yet folded and the
        memory (the paper's prefill gives a segment only the sink and itself; its decoding stage is this).
      * positions are places in the cache (CR-RoPE, as StreamingLLM here), so a 1M-token text never shows
        the model a position past its trained context; folded keys carry the RoPE they had in the cache.
      * folding happens at chunk boundaries when the budget is reached, as many whole segments as are
        due; folds add (M is a sum over tokens), so folding two segments at once equals one by one.
        With the paper's lengths and a larger budget the cache keeps more than L_sink + L_window + L_seg
        (the budget is the ceiling; segments stay L_seg).
      * no folding while an answer is generated (the engine's answer reserve holds it).
    """

    name = "edgeinfinite"
    gate: str = ""
    L_sink: int | None = None
    L_window: int | None = None
    L_seg: int | None = None
    cr_rope: bool = True
    # cells of the segments chosen at the last select, folded by the engine before it compacts
    _fold: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _mem_cells: int = field(default=0, init=False, repr=False, compare=False)
    # the lengths the spec left unset (fit fills them, again on each call)
    _auto: tuple = field(default=(), init=False, repr=False, compare=False)
    # per document: something was folded, so M and z count against the budget (saved with a context)
    _has_memory: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        for name in ("L_sink", "L_window"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise KvpotError(f"edgeinfinite: {name} must be >= 0, got {v}")
        if self.L_seg is not None and self.L_seg < 1:
            raise KvpotError(f"edgeinfinite: L_seg must be >= 1, got {self.L_seg}")
        self._auto = tuple(n for n in ("L_sink", "L_window", "L_seg") if getattr(self, n) is None)

    # -- sizing ---------------------------------------------------------------------------------

    def lengths(self) -> tuple[int, int, int]:
        """(L_sink, L_window, L_seg), the paper's defaults where fit left one unset."""
        return (PAPER_SINK if self.L_sink is None else self.L_sink,
                PAPER_WINDOW if self.L_window is None else self.L_window,
                PAPER_SEG if self.L_seg is None else self.L_seg)

    def fit(self, budget: int, chunk: int) -> None:
        """Fill the lengths the spec left unset from the budget (cells the pot may hold, memory
        included). Called again once the gate is known (its memory then counts): each call starts
        from the spec, so it may be called before and after memory_gate."""
        for name in self._auto:
            setattr(self, name, None)
        avail = budget - self._mem_cells
        fixed = sum(v for v in (self.L_sink, self.L_window, self.L_seg) if v is not None)
        unset = [(n, r) for n, r in (("L_sink", PAPER_SINK), ("L_window", PAPER_WINDOW), ("L_seg", PAPER_SEG))
                 if n in self._auto]
        rest = avail - fixed
        if unset and sum(r for _, r in unset) <= rest:
            for n, r in unset:
                setattr(self, n, r)
        elif unset:
            if rest < 4 * len(unset):
                raise BudgetTooSmall(f"edgeinfinite: budget {budget} leaves {rest} cells for "
                                     f"{', '.join(n for n, _ in unset)} after the memory ({self._mem_cells} cells)")
            # below the paper's lengths: the sink keeps its share, segments are one cell and the window
            # takes the rest, so after a fold the cache holds the budget less the memory and one cell (the
            # docstring; docs/edgeinfinite.md "Budget": the paper's 300 : 200 : 2048 scaled down left 187 of
            # 1024 cells after each fold, segments of an eighth up to 127 cells fewer, of a 64th up to 15)
            names = [n for n, _ in unset]
            want = {"L_sink": max(1, math.floor(avail * PAPER_SINK / (PAPER_SINK + PAPER_WINDOW + PAPER_SEG))),
                    "L_seg": 1}
            taker = next(n for n in ("L_window", "L_seg", "L_sink") if n in names)  # takes what is left
            for n in names:
                if n != taker:
                    setattr(self, n, min(want[n], rest - 4 * (len(names) - 1)))
            setattr(self, taker, avail - sum(v for v in (self.L_sink, self.L_window, self.L_seg) if v is not None))
            if getattr(self, taker) < 1:
                raise BudgetTooSmall(f"edgeinfinite: budget {budget} leaves {getattr(self, taker)} cells for {taker}")
        self.check_budget(budget)

    def check_budget(self, budget: int) -> None:
        """The budget must hold L_sink + L_window + L_seg cells and the memory."""
        if any(getattr(self, n) is None for n in self._auto):
            need = 4 * len(self._auto) + sum(v for v in (self.L_sink, self.L_window, self.L_seg) if v is not None)
            sink, window, seg = need, 0, 0
        else:
            sink, window, seg = self.lengths()
        if sink + window + seg + self._mem_cells > budget:
            raise BudgetTooSmall(f"edgeinfinite: L_sink + L_window + L_seg ({sink} + {window} + {seg}) and the "
                                 f"memory ({self._mem_cells} cells) exceed the budget ({budget})",
                                 least=sink + window + seg + self._mem_cells)

    # -- engine hooks ---------------------------------------------------------------------------

    adapter_kind = "edgeinfinite"

    def memory_gate(self, model_path: Path, shipped: Path | None = None) -> MemoryGate:
        """The gate to run in llama.cpp, checked against the model (before the engine sizes the cache)."""
        if self.gate in ("init", "closed"):
            gate = initial_memory_gate(model_path)
            if self.gate == "closed":
                gate.g[:] = CLOSED_G
        else:
            gate = read_memory_gate(self._gate_path(shipped), model=model_path)
        b = gate.base
        mem_bytes = len(gate.layers) * b.n_head_kv * b.head_dim_k * (b.head_dim_v + 1) * 4
        cell_bytes = len(gate.layers) * b.n_head_kv * (b.head_dim_k + b.head_dim_v) * CELL_ELEM_BYTES
        self._mem_cells = -(-mem_bytes // cell_bytes)
        return gate

    def _gate_path(self, shipped: Path | None) -> Path:
        if self.gate:
            return Path(self.gate).expanduser()
        path = shipped  # the gate shipped for a known model, handed in by the engine or the checks
        if path is None:
            raise KvpotError("edgeinfinite needs a memory gate for this model: --policy edgeinfinite:gate=GATE.gguf "
                             "(made by `kvpot train edgeinfinite`), gate=init for the untrained one or gate=closed for it shut")
        return path

    @property
    def memory_cells(self) -> int:
        """Cells M and z count as once something was folded (0 until memory_gate knows the model)."""
        return self._mem_cells

    def _limit(self, budget: int) -> int:
        """Cells the cache may hold: the budget, less the memory once it exists."""
        return budget - (self._mem_cells if self._has_memory else 0)

    def _due(self, n_cells: int) -> int:
        """Tokens to fold: whole segments of what lies between the sink and the window."""
        sink, window, seg = self.lengths()
        return max(0, (n_cells - sink - window) // seg) * seg

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        return n_cells > self._limit(budget)

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        limit = self._limit(budget)
        if view.n_cells <= limit:
            return None  # short input (or room left): plain attention, nothing folded
        sink, window, seg = self.lengths()
        n_fold = self._due(view.n_cells)
        if n_fold == 0 or view.n_cells - n_fold > limit:
            raise BudgetTooSmall(f"edgeinfinite: budget {budget} cannot hold L_sink + L_window + L_seg "
                                 f"({sink} + {window} + {seg}) and the memory ({self._mem_cells} cells)")
        # per (layer, head) by stream position: the first L_sink stay, the next n_fold are folded
        order = np.argsort(view.positions, axis=-1, kind="stable")
        self._fold = np.sort(order[..., sink:sink + n_fold], axis=-1).astype(np.int64)
        kept = np.concatenate([order[..., :sink], order[..., sink + n_fold:]], axis=-1)
        self._has_memory = True
        return np.sort(kept, axis=-1).astype(np.int64, copy=False)

    def memory_fold(self) -> np.ndarray | None:
        """Cells to fold into the memory before the compaction select just chose (then forgotten)."""
        cells, self._fold = self._fold, None
        return cells

    def reset(self) -> None:
        self._fold = None
        self._has_memory = False

