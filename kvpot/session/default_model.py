"""Which model `ask`, `chat` and `run` use when -m is not given: the most capable known model that is
downloaded and that this device holds with room for a useful pot.

"Holds" is the `--budget auto` memory model (kvpot.session.auto_budget.plan_cells): the weights, the
buffers and a margin, and what is left must hold at least USEFUL_CELLS cells. A bigger model squeezed
into a sliver of KV would read worse than a smaller one with room, so the 1.5B model is chosen where
memory allows it a real pot and the next one down otherwise. Nothing is downloaded here: a default that
fetched a gigabyte unasked would surprise a llama.cpp user; the line on stderr says which model would
answer better and how to get it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_model_facts
from kvpot.models.pull import cached_path, is_cached
from kvpot.models.registry import KNOWN, KnownModel
from kvpot.policies import make_policy
from kvpot.session.auto_budget import DeviceMemory, device_memory, margin_bytes, plan_cells
from kvpot.session.settings import resolve_settings

# the model ask, chat and run use when -m is not given, instead of choosing (a name or a .gguf path)
MODEL_ENV = "KVPOT_MODEL"
# a pot this size still answers the needle and document grids (docs/benchmarks.md, accuracy against budget)
USEFUL_CELLS = 4096


@dataclass(frozen=True)
class DefaultModel:
    name: str
    reason: str          # one line for stderr: why this model
    better: str | None   # a more capable model this device would hold but that is not downloaded


def by_capability() -> list[KnownModel]:
    """Known models, most capable first (the registry's `rank`, from the answer-quality measurements)."""
    return sorted(KNOWN.values(), key=lambda m: m.rank, reverse=True)


def cells_held(model: KnownModel, mem: DeviceMemory) -> int:
    """Cells the device holds for this downloaded model read with its settings (registry defaults under
    the config file): the plan `--budget auto` makes (kvpot.session.reading_plan), from its GGUF facts,
    with the logits every row of a chunk needs when the policy scores tokens (InfiniPot's NuC)."""
    settings = resolve_settings(model.name, model.defaults, {})
    full = settings.policy.partition(":")[0].strip().lower() == "full"
    logprobs = not full and make_policy(settings.policy).before_chunk(settings.chunk).logprobs
    try:
        plan = plan_cells(read_model_facts(cached_path(model)), mem, settings.chunk,
                          logit_rows=settings.chunk if logprobs else 1,
                          # flash attention's plan unless it is off: `auto` turns it on wherever it holds more
                          flash_attn=settings.flash_attn != "off")
    except KvpotError:  # not even a minimal pot fits
        return 0
    return plan.cells


def holds(model: KnownModel, mem: DeviceMemory) -> bool:
    """Whether the device holds this downloaded model with a useful pot (USEFUL_CELLS cells)."""
    return cells_held(model, mem) >= USEFUL_CELLS


def might_hold(model: KnownModel, mem: DeviceMemory) -> bool:
    """For a model not downloaded (no facts to read): its file and the margin fit, with a quarter of the
    file again for the KV cache and buffers. Only used to suggest a pull, never to run."""
    return mem.free_bytes - margin_bytes(mem.free_bytes) >= model.size_bytes * 5 // 4


def choose_default(mem: DeviceMemory) -> DefaultModel:
    """The most capable downloaded model the device holds; refuses, naming what to pull, when none is."""
    ranked = by_capability()
    for i, model in enumerate(ranked):
        if not is_cached(model) or not holds(model, mem):
            continue
        better = next((m.name for m in ranked[:i] if not is_cached(m) and might_hold(m, mem)), None)
        gib = mem.free_bytes / 2**30
        return DefaultModel(model.name, f"model: {model.name} (the most capable downloaded model that "
                                         f"{gib:.1f} GiB free in {mem.where} holds; -m picks another)", better)
    fits = [m for m in ranked if might_hold(m, mem)]
    if not any(is_cached(m) for m in KNOWN.values()):
        if fits:
            raise KvpotError(f"no model is downloaded yet; run `kvpot pull {fits[0].name}` "
                             f"({fits[0].size_bytes / 2**30:.1f} GiB; `kvpot models` lists the others)")
        raise KvpotError("no model is downloaded yet; `kvpot models` lists them (`kvpot pull NAME`)")
    raise KvpotError(f"no downloaded model fits the {mem.free_bytes / 2**30:.1f} GiB free in {mem.where} with a "
                     f"{USEFUL_CELLS}-cell pot; free some memory, or pass -m and --budget N")


def default_model(mem: DeviceMemory | None = None, say=lambda line: None) -> str:
    """The model ask, chat and run use when -m is not given: $KVPOT_MODEL when set, else choose_default on this
    device's memory. `say` gets the lines for stderr."""
    chosen = os.environ.get(MODEL_ENV, "").strip()
    if chosen:
        return chosen
    if mem is None:
        mem = device_memory()
    pick = choose_default(mem)
    say(pick.reason)
    if pick.better:
        say(f"{pick.better} answers better and this device would hold it: kvpot pull {pick.better}")
    return pick.name
