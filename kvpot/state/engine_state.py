"""An engine's state as plain data, for saved contexts: bytes from llama.cpp and kvpot, JSON-able
values, and named NumPy arrays (never pickles: a saved context must not be able to run code)."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import BinaryIO

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.keys import check_state as check_locator_state
from kvpot.state import recall_cells


@dataclass(eq=False)
class SeqInFile:
    """A saved context's llama.cpp sequence state left in its file: `size` bytes at `offset` of `file`, an
    open duplicate of the descriptor the file was checked through (a rename or a new file at its path
    changes nothing here). llama.cpp restores it straight from there (kvpot_state_seq_read_fd), so the
    state (as large as the cache it fills) is never held whole in memory beside that cache. A restore
    after the first (chat's /reset) checks the file against its digest again first (`verify`)."""

    file: BinaryIO
    offset: int
    size: int
    verify: Callable[[], None]
    restored: int = 0

    def __len__(self) -> int:
        return self.size

    def before_restore(self) -> None:
        if self.restored:
            self.verify()
        self.restored += 1


@dataclass
class EngineState:
    seq: bytes | bytearray | SeqInFile           # llama_state_seq_get_data for sequence 0
    pot: bytes                                   # kvpot_pot_state_get
    values: dict = field(default_factory=dict)   # JSON-able bookkeeping; arrays referenced by name
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


_ARRAY = "__array__"
_TUPLE = "__tuple__"


def encode_tree(obj, arrays: dict[str, np.ndarray], prefix: str):
    """Nested dicts/lists/tuples of scalars and arrays -> JSON-able data; arrays go to `arrays`."""
    if isinstance(obj, np.ndarray):
        name = f"{prefix}"
        arrays[name] = np.ascontiguousarray(obj)
        return {_ARRAY: name}
    if isinstance(obj, dict):
        return {str(k): encode_tree(v, arrays, f"{prefix}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [encode_tree(v, arrays, f"{prefix}.{i}") for i, v in enumerate(obj)]
        return {_TUPLE: items} if isinstance(obj, tuple) else items
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot save a {type(obj).__name__} in a context file ({prefix})")


def decode_tree(data, arrays: dict[str, np.ndarray]):
    if isinstance(data, dict):
        if _ARRAY in data:
            name = data[_ARRAY]
            if not isinstance(name, str) or name not in arrays or len(data) != 1:
                raise KvpotError(f"saved state names an array it does not hold: {str(name)[:60]}")
            return arrays[name]
        if _TUPLE in data:
            if not isinstance(data[_TUPLE], list) or len(data) != 1:
                raise KvpotError("saved state holds a malformed tuple")
            return tuple(decode_tree(v, arrays) for v in data[_TUPLE])
        return {k: decode_tree(v, arrays) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_tree(v, arrays) for v in data]
    return data


# -- checks of a saved state before any of it is restored ---------------------------------------------
# Each raises ValueError with what is wrong; kvpot.session.context_file turns it into one line naming
# the file. None of them needs the model: they run on the file alone (and under the fuzzer).

INT32_MAX = 2**31 - 1   # llama.cpp's positions and cell counts are int32
INT64_MAX = 2**63 - 1
N_CTX = "n_ctx"         # a bound that is the context's cell count (recall_cells.SAVED says it too)

# the engine's bookkeeping (kvpot.engine's _SAVED_SCALARS), then the values of the engine's RecallCells,
# which older contexts may lack: name -> (type, smallest, largest)
ENGINE_SCALARS = {
    "tokens_seen": (int, 0, INT64_MAX), "pos_next": (int, 0, INT32_MAX), "n_compactions": (int, 0, INT32_MAX),
    "compact_seconds": (float, 0.0, math.inf), "nll_sum": (float, -math.inf, math.inf),
    "nll_count": (int, 0, INT64_MAX), "_carry_lp": (float, None, None), "_bos_done": (bool, None, None),
    "step": (int, 0, INT32_MAX),
}
ENGINE_OPTIONAL = dict(recall_cells.SAVED)
_MAX_POT_LAYERS, _MAX_HEADS = 512, 1 << 16   # LLAMA_MAX_LAYERS; KV heads as the GGUF checks allow


def _scalar_problem(value, kind: type, lo, hi) -> str | None:
    if kind is bool:
        return None if isinstance(value, bool) else "is not true or false"
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        return f"is not a{'n integer' if kind is int else ' number'}"
    if kind is float and lo is None:
        return None  # NaN and infinities are values here (a log p not yet known)
    if kind is float and not math.isfinite(value):
        return "is not finite"
    if not lo <= value <= hi:
        return f"is {value}, outside {lo}..{hi}"
    return None


def check_engine_values(values: dict, arrays: dict[str, np.ndarray], n_ctx: int) -> None:
    """The engine's bookkeeping and arrays: types, ranges, and cell ranges inside the context."""
    unknown = sorted(set(values) - set(ENGINE_SCALARS) - set(ENGINE_OPTIONAL) - {"policy", "locator"})
    if unknown:
        raise ValueError(f"engine state has unknown fields {unknown[:5]}")
    for name, (kind, lo, hi) in (ENGINE_SCALARS | ENGINE_OPTIONAL).items():
        if name not in values:
            if name in ENGINE_SCALARS:
                raise ValueError(f"engine state has no {name}")
            continue
        problem = _scalar_problem(values[name], kind, lo, n_ctx if hi == N_CTX else hi)
        if problem:
            raise ValueError(f"engine.{name} {problem}")
    recall_cells.check_saved(values, n_ctx)
    if "policy" not in values:
        raise ValueError("engine state has no policy state")
    check_positions(arrays, values["tokens_seen"], n_ctx)
    if "locator" in values:  # the read-once locator's keys (kvpot.locator.keys); older contexts have none
        check_locator_state(values["locator"], {k[len("locator_"):]: v for k, v in arrays.items()
                                             if k.startswith("locator_")}, tokens_seen=values["tokens_seen"])
    memory = arrays.get("memory")
    if memory is not None and (memory.dtype != np.uint8 or memory.ndim != 1):
        raise ValueError("array 'memory' is not a flat uint8 array")


def check_positions(arrays: dict[str, np.ndarray], tokens_seen: int, n_ctx: int) -> None:
    """`positions`: int64 [pot layers, KV heads, cells], each the stream position of a token read."""
    pos = arrays.get("positions")
    if pos is None:
        raise ValueError("array 'positions' is missing")
    if pos.dtype.kind not in "iu" or pos.ndim != 3:
        raise ValueError(f"array 'positions' is {pos.dtype} with {pos.ndim} dimensions, not int64 [layers, heads, cells]")
    if not (1 <= pos.shape[0] <= _MAX_POT_LAYERS and 1 <= pos.shape[1] <= _MAX_HEADS and pos.shape[2] <= n_ctx):
        raise ValueError(f"array 'positions' has shape {pos.shape}, not [layers, KV heads, at most {n_ctx} cells]")
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= tokens_seen):
        raise ValueError(f"array 'positions' holds positions outside the {tokens_seen} tokens read")


_POT_HEAD = np.dtype("<i4")


def check_pot_bytes(pot: bytes, positions: np.ndarray, pos_next: int) -> None:
    """kvpot's C state (docs/formats.md, `POT `) against the engine's arrays: its shape, its size, and
    every count and RoPE position in range, before kvpot_pot_state_set reads it."""
    if len(pot) < 28 or len(pot) % 4:
        raise ValueError(f"kvpot state has {len(pot)} bytes")
    words = np.frombuffer(pot, dtype=_POT_HEAD)
    magic, version, n_layer, n_head, n_compacted, budget, n_compactions = (int(w) for w in words[:7])
    if pot[:4] != b"KVPS" or version != 2:
        raise ValueError("kvpot state has another magic or version")
    if (n_layer, n_head) != positions.shape[:2]:
        raise ValueError(f"kvpot state is for {n_layer} x {n_head} layers x KV heads, its positions for "
                         f"{positions.shape[0]} x {positions.shape[1]}")
    if not 0 <= n_compacted <= positions.shape[2]:
        raise ValueError(f"kvpot state covers {n_compacted} compacted cells of {positions.shape[2]}")
    if budget < 0 or n_compactions < 0:
        raise ValueError("kvpot state has a negative budget or compaction count")
    n_pos = n_layer * n_head * n_compacted
    if words.size != 7 + n_pos + n_layer:
        raise ValueError(f"kvpot state has {len(pot)} bytes, expected {4 * (7 + n_pos + n_layer)}")
    rope, live = words[7:7 + n_pos], words[7 + n_pos:]
    if rope.size and (int(rope.min()) < 0 or int(rope.max()) >= max(pos_next, 1)):
        raise ValueError(f"kvpot state holds RoPE positions outside 0..{pos_next - 1}")
    if live.size and (int(live.min()) < min(n_compacted, 1) or int(live.max()) > n_compacted):
        raise ValueError(f"kvpot state: a layer holds more or fewer than its {n_compacted} compacted cells")


def check_policy_state(policy, tree, arrays: dict[str, np.ndarray], where: str = "policy") -> None:
    """A policy's saved state against the policy built from the saved spec: every field is one the
    policy saves (init=False fields, or {"wrapped": ...} for a policy it wraps), of its declared type,
    with numeric arrays only."""
    if not isinstance(tree, dict):
        raise ValueError(f"{where} state is not an object")
    declared = {f.name: f for f in fields(policy)} if hasattr(policy, "__dataclass_fields__") else {}
    hints = typing.get_type_hints(type(policy)) if declared else {}
    for name, value in tree.items():
        f = declared.get(name)
        if f is None:
            raise ValueError(f"{where} state has an unknown field {name!r}")
        if f.init:
            inner = getattr(policy, name)
            if not hasattr(inner, "load_state_dict") or not isinstance(value, dict) or set(value) != {"wrapped"}:
                raise ValueError(f"{where}.{name} is not the state of a wrapped policy")
            check_policy_state(inner, value["wrapped"], arrays, f"{where}.{name}")
            continue
        try:
            decoded = decode_tree(value, arrays)
        except KvpotError as e:
            raise ValueError(f"{where}.{name}: {e}") from None
        if not _matches(decoded, hints.get(name, typing.Any)):
            raise ValueError(f"{where}.{name} is not a {_hint_name(hints.get(name))}")


def _matches(value, hint) -> bool:
    """Whether a decoded value has a field's declared type (the annotations of the policies' dataclasses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX - 1 <= value <= INT64_MAX
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is np.ndarray:
        return isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.ndim <= 4
    if hint is tuple or origin is tuple:
        if not isinstance(value, tuple):
            return False
        if not args:
            return all(_plain(v) for v in value)
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(args) == len(value) and all(_matches(v, a) for v, a in zip(value, args))
    if hint is dict or origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if hint is list or origin is list:
        return isinstance(value, list) and all(_plain(v) for v in value)
    return False


def _plain(value) -> bool:
    """A JSON scalar or a numeric array: what an untyped container in a policy's state may hold."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    if isinstance(value, int) and not isinstance(value, bool):
        return -INT64_MAX - 1 <= value <= INT64_MAX
    return value is None or isinstance(value, (bool, float, str))


def _hint_name(hint) -> str:
    return str(hint).replace("numpy.", "np.").replace("typing.", "") if hint is not None else "known type"
