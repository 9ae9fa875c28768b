"""Write checkpoints in torch.save's zip layout without torch (for tests of the weights-only reader).

The pickle is assembled opcode by opcode, the way torch.save lays out a state dict: an
OrderedDict whose values are torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, hooks), each storage a persistent id ('storage', torch.<Dtype>Storage, key,
'cpu', numel) whose bytes sit in <archive>/data/<key>.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np

_TAG = {np.dtype("float32"): "FloatStorage", np.dtype("float16"): "HalfStorage", "bf16": "BFloat16Storage"}


def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def _int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)  # BININT


def _tuple(items: list[bytes]) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (what torch's .to(torch.bfloat16) does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_checkpoint(path: Path, tensors: dict[str, np.ndarray], *, bf16: bool = True, archive: str | None = None,
                     pickle_bytes: bytes | None = None) -> None:
    """tensors: name -> float array (stored as bf16 when bf16, else in its own dtype).
    pickle_bytes replaces data.pkl (to test hostile files)."""
    archive = archive or Path(path).stem
    pkl = b"\x80\x02" + _global("collections", "OrderedDict") + b")R"  # PROTO 2, OrderedDict()
    blobs = {}
    for key, (name, arr) in enumerate(tensors.items()):
        arr = np.ascontiguousarray(arr)
        raw = to_bf16_bits(arr) if bf16 else arr
        tag = _TAG["bf16"] if bf16 else _TAG[arr.dtype]
        blobs[str(key)] = raw.tobytes()
        storage = _tuple([_str("storage"), _global("torch", tag), _str(str(key)), _str("cpu"), _int(arr.size)]) + b"Q"
        strides = [int(s // arr.itemsize) for s in arr.strides]
        args = _tuple([storage, _int(0), _tuple([_int(int(n)) for n in arr.shape]), _tuple([_int(s) for s in strides]),
                       b"\x89", _global("collections", "OrderedDict") + b")R"])  # requires_grad False, hooks {}
        pkl += _str(name) + _global("torch._utils", "_rebuild_tensor_v2") + args + b"R" + b"s"  # SETITEM
    pkl += b"."
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{archive}/data.pkl", pickle_bytes if pickle_bytes is not None else pkl)
        zf.writestr(f"{archive}/byteorder", "little")
        for key, raw in blobs.items():
            zf.writestr(f"{archive}/data/{key}", raw)
        zf.writestr(f"{archive}/version", "3\n")
