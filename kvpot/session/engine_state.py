"""An engine's state as plain data, for saved contexts: bytes from llama.cpp and kvpot, JSON-able
values, and named NumPy arrays (never pickles: a saved context must not be able to run code)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError


@dataclass
class EngineState:
    seq: bytes                                   # llama_state_seq_get_data for sequence 0
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
            try:
                return arrays[data[_ARRAY]]
            except KeyError:
                raise KvpotError(f"saved state names an array it does not hold: {data[_ARRAY]}") from None
        if _TUPLE in data:
            return tuple(decode_tree(v, arrays) for v in data[_TUPLE])
        return {k: decode_tree(v, arrays) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_tree(v, arrays) for v in data]
    return data
