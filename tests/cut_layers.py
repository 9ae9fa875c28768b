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

from kvpot.models.gguf_file import _TYPE_SIZES, read_header  # _TYPE_SIZES: (elements, bytes) a block

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


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
    kv = read_header(src)  # checks the file as kvpot does before anything is copied
    arch = kv["general.architecture"]
    alignment = kv.get("general.alignment", 32)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        w = _Walk(buf)
        magic, version = w.unpack("<I"), w.unpack("<I")
        n_tensors, n_kv = w.unpack("<Q"), w.unpack("<Q")
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

        kept = []  # (name, dims, type, source offset, bytes)
        for _ in range(n_tensors):
            name = w.string()
            dims = [w.unpack("<q") for _ in range(w.unpack("<I"))]
            gtype, offset = w.unpack("<I"), w.unpack("<Q")
            block, block_bytes = _TYPE_SIZES[gtype]
            n_elements = 1
            for d in dims:
                n_elements *= d
            if not (name.startswith("blk.") and int(name.split(".")[1]) >= n):
                kept.append((name, dims, gtype, offset, n_elements // block * block_bytes))
        data_start = w.at + (-w.at % alignment)

        with open(dst, "wb") as out:
            out.write(struct.pack("<IIQQ", magic, version, len(kept), n_kv))
            out.write(kv_bytes)
            offset = 0
            for name, dims, gtype, _, size in kept:
                raw = name.encode()
                out.write(struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(dims)))
                out.write(struct.pack(f"<{len(dims)}q", *dims) + struct.pack("<IQ", gtype, offset))
                offset += size + (-size % alignment)
            out.write(b"\0" * (-out.tell() % alignment))
            for _, _, _, src_offset, size in kept:
                at = data_start + src_offset
                out.write(buf[at:at + size])
                out.write(b"\0" * (-size % alignment))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
