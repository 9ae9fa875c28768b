"""`--budget auto`: how many KV cells the device holds for a model, and whether a document is read
with full attention (the exact stock computation) or through the pot.

Pure arithmetic on facts passed in (the model's GGUF facts, the device's free memory), so it is
tested without a model; `device_memory()` is the one probe of the machine.

The weights cost their file's size: llama.cpp maps the file, and the weights it copies elsewhere at
load time (the CPU's repacked layouts) do not keep their mapped pages: kvpot gives the file's pages back
as the loader copies weights out of them (kvpot_load_progress_release) and those of the copied weights
again once loading ends (LlamaModel.release_copied), so nothing is counted twice, while loading or after.

What a context of n cells costs, besides the weights (llama.cpp):
  KV:        per global layer n cells x KV heads x (key + value width) x 2 bytes (f16);
             per sliding-window layer at most window + chunk cells, however long the input
  attention: with flash attention (`--flash-attn on`, or auto on a device that needs it) the mask over
             the cells, chunk x n x 2 bytes (f16): the scores never exist whole. Without it the chunk's
             scores and their softmax, 2 x heads x chunk x n x 4 bytes (f32), one layer at a time (the
             graph allocator reuses them across layers), which outgrows the KV itself
  logits:    the rows the compute buffer reserves for the output head (the context's n_outputs_max:
             the step's last row, plus one soft-max block of max(64, ceil(rows / 16)) rows where a
             policy needs each token's log-probability, NuC; kvpot.runtime.outputs), x vocabulary x
             4 bytes, plus the row copied out to llama.cpp. llama.cpp's default, a step's every row,
             would hold chunk x vocabulary x 4 bytes (512 MiB for a 262K vocabulary at 512 a step)
  activations: chunk x (4 x embedding + 2 x feed-forward) x 4 bytes
  a kept copy: a session that can go back to the state right after reading (chat's /reset) holds a
             copy of every cell read, as large as the KV itself; `kvpot ask` keeps none
Those are estimates; the margin covers what they miss (small graphs, the tokenizer, Python).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import ModelFacts
from kvpot.runtime.devices import devices, layer_devices
from kvpot.runtime.outputs import MARKED_ROWS, outputs_max
from kvpot.session.beyond_window import MeasuredPot
from kvpot.session.beyond_window import default_pot as measured
from kvpot.session.memory_cgroup import cgroup_room

KV_BYTES = 2                 # f16 cache cells
F16 = 2
F32 = 4
# left free: a quarter of what is free now (other programs, estimate error), and at least 512 MiB
MARGIN_SHARE = 0.25
MARGIN_MIN = 512 << 20
# bytes of free memory to plan with instead of probing the machine
MEMORY_ENV = "KVPOT_DEVICE_MEMORY"
# fewer cells than this is no useful pot: refuse rather than read with a sliver of memory
MIN_CELLS = 256


@dataclass(frozen=True)
class DeviceMemory:
    free_bytes: int
    where: str               # "RAM", or the GPU's name
    holds_weights: bool = True  # CPU: the weights are mapped into the same RAM


@dataclass(frozen=True)
class DevicePlan:
    """The largest context (in cells) the device holds for the model, and why."""

    cells: int
    reason: str


def global_kv_bytes_per_cell(facts: ModelFacts) -> int:
    """Bytes one more cell costs in every layer whose cache grows with the input."""
    n_global = sum(1 for swa in _swa(facts) if not swa)
    return n_global * facts.n_head_kv * (facts.head_dim_k + facts.head_dim_v) * KV_BYTES


def window_kv_bytes(facts: ModelFacts, chunk: int) -> int:
    """The sliding-window layers' caches: window + chunk cells each, whatever the input."""
    n_swa = sum(1 for swa in _swa(facts) if swa)
    return n_swa * (facts.sliding_window + chunk) * facts.n_head_kv * (facts.head_dim_k + facts.head_dim_v) * KV_BYTES


def kv_bytes(facts: ModelFacts, cells: int, chunk: int) -> int:
    """Whole KV cache of a context of `cells` cells (sliding-window layers capped at their window)."""
    n_swa = sum(1 for swa in _swa(facts) if swa)
    per_layer = facts.n_head_kv * (facts.head_dim_k + facts.head_dim_v) * KV_BYTES
    swa_cells = min(cells, facts.sliding_window + chunk)
    return global_kv_bytes_per_cell(facts) * cells + n_swa * per_layer * swa_cells


@dataclass(frozen=True)
class ContextCost:
    """Bytes a context of `cells` cells costs, by part (the module docstring's model)."""

    kv: int              # K and V of every layer (sliding-window layers capped at window + chunk)
    scores: int          # one chunk's attention scores and softmax over the context
    logits: int          # the output rows in the graph, the soft-max block of NuC, the row copied out
    activations: int     # the chunk's hidden states and feed-forward

    @property
    def compute(self) -> int:
        return self.scores + self.logits + self.activations

    @property
    def total(self) -> int:
        return self.kv + self.compute


def logit_rows_held(logit_rows: int, reserved: int | None = None) -> int:
    """Rows of vocabulary-wide floats a context holds: the rows its compute buffer reserves for the
    output head, `reserved` (its n_outputs_max; default what the engine asks for: the marked row, plus
    NuC's block of rows when every one of the step's `logit_rows` rows is scored), and llama.cpp's copy
    of the marked row."""
    if reserved is None:
        reserved = outputs_max(logit_rows, logprobs=logit_rows > 1)
    return reserved + MARKED_ROWS


def scores_bytes_per_cell(facts: ModelFacts, chunk: int, flash_attn: bool) -> int:
    """What one more cell adds to a step's attention buffers: the f16 mask's column with flash
    attention, else the scores and their softmax in every head."""
    return chunk * F16 if flash_attn else 2 * facts.n_head * chunk * F32


def context_cost(facts: ModelFacts, cells: int, chunk: int, logit_rows: int, flash_attn: bool = False,
                 reserved_rows: int | None = None) -> ContextCost:
    """`logit_rows`: 1, or the chunk where every row's log-prob is scored (NuC); `reserved_rows`: the
    context's n_outputs_max where it is not the engine's (kvpot.runtime.outputs), e.g. llama.cpp's
    default of the whole chunk."""
    return ContextCost(kv=kv_bytes(facts, cells, chunk),
                       scores=scores_bytes_per_cell(facts, chunk, flash_attn) * cells,
                       logits=logit_rows_held(logit_rows, reserved_rows) * facts.n_vocab * F32,
                       activations=chunk * (4 * facts.n_embd + 2 * facts.n_ff) * F32)


def compute_bytes(facts: ModelFacts, cells: int, chunk: int, logit_rows: int, flash_attn: bool = False,
                  reserved_rows: int | None = None) -> int:
    """The chunk's compute buffer and logits for a context of `cells` cells."""
    return context_cost(facts, cells, chunk, logit_rows, flash_attn, reserved_rows).compute


def margin_bytes(free: int) -> int:
    return max(MARGIN_MIN, int(MARGIN_SHARE * free))


def plan_cells(facts: ModelFacts, mem: DeviceMemory, chunk: int, logit_rows: int,
               keeps_copy: bool = False, flash_attn: bool = False, reserved_rows: int | None = None,
               besides: int = 0) -> DevicePlan:
    """Cells of the largest context that fits: free memory less the margin, the weights (where
    they share the device), the fixed costs (sliding-window caches, logits, activations), divided
    by what each cell costs (global-layer KV + the chunk's attention scores over it); capped at
    the model's trained context, the longest span its positions were trained for. `keeps_copy`: the
    session keeps a copy of the cells read (chat's /reset), which costs their KV once more;
    `flash_attn`: the context runs flash attention, whose step holds no scores over the cells;
    `reserved_rows`: the context's n_outputs_max, where it is not the engine's (context_cost); `besides`: bytes the
    reading holds beside its cells (the read-once locator's keys, kvpot.locator.keys)."""
    copies = 2 if keeps_copy else 1
    fixed = (copies * window_kv_bytes(facts, chunk) + compute_bytes(facts, 0, chunk, logit_rows, flash_attn, reserved_rows)
             + besides)
    weights = facts.file_bytes if mem.holds_weights else 0
    margin = margin_bytes(mem.free_bytes)
    per_cell = copies * global_kv_bytes_per_cell(facts) + scores_bytes_per_cell(facts, chunk, flash_attn)
    usable = mem.free_bytes - margin - weights - fixed
    fits = usable // per_cell if usable > 0 else 0
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    if fits < MIN_CELLS:
        raise KvpotError(
            f"not enough memory for a pot: {mib(mem.free_bytes)} free in {mem.where}, the model needs "
            f"{mib(weights)} of weights + {mib(fixed)} of buffers + a {mib(margin)} margin, leaving room for "
            f"{max(fits, 0)} cells (at least {MIN_CELLS}); free some memory or pass --budget N")
    cap = facts.n_ctx_train or fits
    cells = min(fits, cap)
    why = (f"{mib(mem.free_bytes)} free in {mem.where}, less {mib(weights)} weights, {mib(fixed)} buffers and a "
           f"{mib(margin)} margin, at {per_cell / 1024:,.1f} KiB per cell holds {fits:,} cells")
    if cells < fits:
        why += f"; capped at the model's trained context of {cap:,}"
    return DevicePlan(cells=int(cells), reason=why)


@dataclass(frozen=True)
class Reading:
    """How a document is read: "full" attention in a context of `cells`, or the pot at budget `cells`."""

    mode: str
    cells: int
    reason: str


def choose_reading(plan: DevicePlan, n_ctx_train: int, doc_tokens: int | None, reserve: int, chunk: int,
                   complete: bool = True, default_pot: MeasuredPot | None = None) -> Reading:
    """Full attention when the document (counted exactly, None when unknown, e.g. stdin; `complete`
    False when counting stopped past the limit, so `doc_tokens` is a lower bound) plus the
    question and answer fit both the device's context and the model's trained context: that is what
    stock llama.cpp computes. Otherwise the pot, as large as the device holds, or at most `default_pot`
    (the default path's size measured best past the window, kvpot.session.beyond_window, and how it was
    asked, which the reason says). Full attention needs
    no chunk of room past the document (it never distills; FullAttention.cache_cells), so a document
    up to the limit less the answer's room is read whole, as stock llama.cpp reads it."""
    limit = min(plan.cells, n_ctx_train or plan.cells)
    if doc_tokens is not None and doc_tokens + reserve <= limit:
        return Reading("full", doc_tokens, f"the input's {doc_tokens:,} tokens fit the {limit:,} cells the device and "
                                           f"the model's trained context allow: full attention, as stock llama.cpp")
    budget = pot_cells(plan.cells, n_ctx_train, reserve, chunk)
    pot = f"the pot takes {budget:,} cells"
    if default_pot:
        budget, pot = measured(budget, default_pot)
    if doc_tokens is None:
        what = "its length is unknown (stdin)"
    elif complete:
        what = f"{doc_tokens:,} tokens do not fit {limit:,} cells"
    else:  # counting stopped once past the limit: the figure reached is not the input's length
        what = f"more than {limit:,} tokens do not fit {limit:,} cells"
    return Reading("pot", budget, f"{what}: {pot} ({plan.reason})")


def pot_cells(cells: int, n_ctx_train: int, reserve: int, chunk: int) -> int:
    """The largest pot budget in a context of `cells` (the device's plan, already capped at the trained
    context): what is left after the chunk being read and the answer's room."""
    budget = min(cells, n_ctx_train or cells) - reserve - chunk
    if budget < MIN_CELLS:
        raise KvpotError(f"the device holds {cells:,} cells; with {reserve + chunk:,} for reading and answering "
                         f"that leaves less than a {MIN_CELLS}-cell pot; pass --budget N")
    return budget


def full_context(n_ctx_train: int, doc_tokens: int | None, reserve: int, chunk: int, limit: int,
                 exact: bool = True, asked: bool = False) -> int:
    """`--policy full`: the cells the document needs; refuses before reading when they cannot fit
    `limit` (the device's, or the user's when `asked`) or the model's trained context."""
    cap = min(limit, n_ctx_train or limit)
    if doc_tokens is None:
        return max(MIN_CELLS, cap - reserve)
    need = doc_tokens + reserve  # no reading room: full attention's context is the document itself
    if need > cap:
        which = ("the model's trained context" if cap == n_ctx_train and not (asked and limit == cap) else
                 "the context size asked for," if asked else "the memory for")
        size = f"{doc_tokens:,} tokens" if exact else f"more than {doc_tokens:,} tokens (counting stopped there)"
        raise KvpotError(f"full attention keeps every token: the input is {size}, {need:,} cells with "
                         f"answering room ({reserve}), more than {which} {cap:,} cells; "
                         f"choose a pot policy (e.g. --policy infinipot)")
    return doc_tokens


def device_memory(devs: list | None = None) -> DeviceMemory:
    """Free memory where the KV cache will live. kvpot offloads every layer, so when llama.cpp has
    devices for them (a GPU backend's, RPC servers', an integrated GPU when there is no discrete
    one: runtime.devices.layer_devices) the cache is spread over those and their free memory, as
    ggml reports it, is what counts; else RAM (MemAvailable on Linux, free + inactive pages
    elsewhere), or less where a memory cgroup's limit leaves less (kvpot.session.memory_cgroup).
    `devs`: the devices to plan with (default: the loaded runtime's)."""
    pretend = os.environ.get(MEMORY_ENV)
    if pretend:  # another device's memory (a phone's, a test's), weights included
        return DeviceMemory(free_bytes=parse_size(pretend, MEMORY_ENV), where=f"{MEMORY_ENV}", holds_weights=True)
    if devs is None:
        devs = devices()
    offload = layer_devices(devs)
    if offload:
        # the weights go there too (llama.cpp splits the layers by free memory, so the sum is what they share)
        return DeviceMemory(free_bytes=sum(d.free_bytes for d in offload),
                            where=" + ".join(f"{d.name} ({d.description})" for d in offload), holds_weights=True)
    free, group = _available_ram(), cgroup_room()
    if group is not None and group.room_bytes < free:
        # a container's limit: the kernel kills the process there, whatever the machine has free
        return DeviceMemory(free_bytes=group.room_bytes, holds_weights=True,
                            where=f"RAM under its memory cgroup's {group.limit_bytes / 2**30:.1f} GiB limit")
    return DeviceMemory(free_bytes=free, where="RAM", holds_weights=True)


# K, M, G, T and KiB … TiB are powers of 1024 (as free(1) and llama.cpp's logs count memory); KB … TB of 1000
_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS[_p] = _UNITS[_p + "ib"] = 1024 ** _i
    _UNITS[_p + "b"] = 1000 ** _i


def parse_size(text: str, what: str) -> int:
    """Bytes from "1610612736", "3GiB", "1.5G", "512 MiB" or "2GB"; one clear line otherwise."""
    s = text.strip().lower()
    number = s.rstrip("kmgtib ")
    unit = s[len(number):].strip()
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise KvpotError(f"{what} must be a size in bytes or with a unit (3GiB, 1.5G, 512MiB, 2GB), "
                         f"got {text!r}") from None
    if not value >= 1 or value != value or value == float("inf"):
        raise KvpotError(f"{what} must be a positive size, got {text!r}")
    return int(value)


def _available_ram() -> int:
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    for name, share in (("SC_AVPHYS_PAGES", 1.0), ("SC_PHYS_PAGES", 0.5)):  # macOS has only the total: half of it
        try:
            return int(os.sysconf(name) * os.sysconf("SC_PAGE_SIZE") * share)
        except (ValueError, OSError, AttributeError):
            continue
    raise KvpotError("cannot tell how much memory is free on this machine; pass --budget N")


def _swa(facts: ModelFacts) -> tuple[bool, ...]:
    return facts.swa_layers or (False,) * facts.n_layer
