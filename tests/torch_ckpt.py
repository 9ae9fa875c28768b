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


# -- hostile checkpoints --------------------------------------------------------------------------

def tensor_pickle(tensors: list[tuple[str, str, str, int, int, list[int], list[int]]]) -> bytes:
    """A state dict's pickle with views chosen freely: (name, storage tag, storage key, storage numel,
    offset, size, stride) each, so sizes and strides need not fit the storage."""
    pkl = b"\x80\x02" + _global("collections", "OrderedDict") + b")R"
    for name, tag, key, numel, offset, size, stride in tensors:
        storage = _tuple([_str("storage"), _global("torch", tag), _str(key), _str("cpu"), _int(numel)]) + b"Q"
        args = _tuple([storage, _int(offset), _tuple([_int(n) for n in size]), _tuple([_int(s) for s in stride]),
                       b"\x89", _global("collections", "OrderedDict") + b")R"])
        pkl += _str(name) + _global("torch._utils", "_rebuild_tensor_v2") + args + b"R" + b"s"
    return pkl + b"."


def zeros_deflated(n: int) -> tuple[bytes, int]:
    """n zero bytes as a raw deflate stream (a zip bomb's payload: ~1000x smaller) and their CRC-32."""
    import zlib

    comp = zlib.compressobj(1, zlib.DEFLATED, -15)
    piece, crc, out = bytes(1 << 20), 0, []
    for i in range(0, n, len(piece)):
        chunk = piece[: min(len(piece), n - i)]
        crc = zlib.crc32(chunk, crc)
        out.append(comp.compress(chunk))
    out.append(comp.flush())
    return b"".join(out), crc


def write_raw_zip(path: Path, entries: list[tuple[str, bytes, int, int, int]]) -> None:
    """A zip written field by field: (name, payload, method 0 stored / 8 deflated, crc, declared size) each,
    so an entry may declare another size than its payload inflates to (sizes below 4 GiB)."""
    local, central = b"", b""
    for name, payload, method, crc, size in entries:
        nb = name.encode()
        common = struct.pack("<HHHHHIIIHH", 20, 0, method, 0, 0, crc, len(payload), size, len(nb), 0)
        central += b"PK\x01\x02" + struct.pack("<H", 20) + common + struct.pack("<HHHII", 0, 0, 0, 0, len(local)) + nb
        local += b"PK\x03\x04" + common + nb + payload
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, len(entries), len(entries), len(central), len(local), 0)
    Path(path).write_bytes(local + central + end)
