"""Write a GGUF model cut to its first N blocks (every other tensor and all metadata copied, the block
count set to N): a small real model for tests that compare two paths through the same model
(tests/conftest.py's cut fixtures) and for a machine that cannot take the whole file, such as a GPU
machine reached with a size limit (tests/cuda_pot_check.sh). Its answers are nonsense; the pot's
arithmetic on it is the same as on the whole model.

The file is rewritten byte for byte rather than through gguf-py, whose reader builds an object for every
vocabulary entry (~40 s for Gemma-3's 262K tokens): the key/value section is copied as it is but for the
block count's value, the tensor infos of the blocks left out are dropped and the others' offsets recounted,
and each kept tensor's data is copied from the source.

usage: python cut_layers.py IN.gguf OUT.gguf N
"""

from __future__ import annotations

import mmap
import struct
import sys

from kvpot.models.gguf_file import _ARRAY, _SCALARS, _STRING, read_gguf

_SCALAR_SIZES = {vtype: size for vtype, (_, size) in _SCALARS.items()}


class _Walk:
    """A cursor over the source file's bytes."""

    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def unpack(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.unpack("<Q")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALAR_SIZES:
            self.at += _SCALAR_SIZES[vtype]
        elif vtype == _STRING:
            self.at += 8 + self.unpack("<Q")
        elif vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALAR_SIZES:
                self.at += _SCALAR_SIZES[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")


def main(src: str, dst: str, n: int) -> None:
    kv, tensors = read_gguf(src)  # checked as kvpot checks a model; where each tensor's data lies
    arch = kv["general.architecture"]
    alignment = kv.get("general.alignment", 32)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        w = _Walk(buf)
        magic, version = w.unpack("<I"), w.unpack("<I")
        w.at += 8  # the tensor count: the cut file gets its own
        n_kv = w.unpack("<Q")
        kv_start = w.at
        count_at = count_type = None  # where the block count's value lies, and its type
        for _ in range(n_kv):
            key, vtype = w.string(), w.unpack("<I")
            if key == f"{arch}.block_count":
                count_at, count_type = w.at, vtype
            w.skip_value(vtype)
        kv_bytes = bytearray(buf[kv_start:w.at])
        fmt = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}[count_type]
        struct.pack_into(fmt, kv_bytes, count_at - kv_start, n)

        kept = [t for t in tensors if not (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n)]

        with open(dst, "wb") as out:
            out.write(struct.pack("<IIQQ", magic, version, len(kept), n_kv))
            out.write(kv_bytes)
            offset = 0
            for t in kept:
                raw = t.name.encode()
                out.write(struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(t.dims)))
                out.write(struct.pack(f"<{len(t.dims)}q", *t.dims) + struct.pack("<IQ", t.gtype, offset))
                offset += t.n_bytes + (-t.n_bytes % alignment)
            out.write(b"\0" * (-out.tell() % alignment))
            for t in kept:
                out.write(buf[t.offset:t.offset + t.n_bytes])
                out.write(b"\0" * (-t.n_bytes % alignment))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
