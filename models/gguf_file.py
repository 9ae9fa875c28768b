"""Check a GGUF file in Python before any of it reaches llama.cpp, and read the facts kvpot needs.

A small reader of the GGUF header (key/value section only): gguf-py's GGUFReader builds
objects for every vocabulary entry and takes ~20 s on Gemma's 262K-token vocabulary,
while this skips arrays it does not need.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from kvpot.errors import KvpotError

GGUF_MAGIC = b"GGUF"

# GGUF value types: id -> (struct format, size) for fixed-size scalars
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_MAX_KV = 1 << 20
# the fewest bytes each declared item can take, to check a count against the file's size before
# reading that many: a key/value (key length, a key of at least one byte, value type, a one-byte
# value) and a tensor info (name length, dimension count, type, offset)
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_FIXED_HEADER = 4 + 4 + 8 + 8      # magic, version, tensor count, key/value count
_MAX_DIMS, _MAX_NAME = 4, 64       # ggml's GGML_MAX_DIMS, GGML_MAX_NAME (a name is shorter)
_DEFAULT_ALIGNMENT = 32            # GGUF_DEFAULT_ALIGNMENT
# ggml types a GGUF tensor may have in the pinned llama.cpp (ggml.h, ggml.c's type_traits): id ->
# (elements per block, bytes per block); the ids missing were removed from GGUF files
_QK_K = 256
_TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (_QK_K, 84), 11: (_QK_K, 110), 12: (_QK_K, 144), 13: (_QK_K, 176), 14: (_QK_K, 210), 15: (_QK_K, 292),
    16: (_QK_K, 66), 17: (_QK_K, 74), 18: (_QK_K, 98), 19: (_QK_K, 50), 20: (32, 18), 21: (_QK_K, 110),
    22: (_QK_K, 82), 23: (_QK_K, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (_QK_K, 56), 30: (1, 2), 34: (_QK_K, 54), 35: (_QK_K, 66), 39: (32, 17), 40: (64, 36),
    41: (128, 18), 42: (64, 18),
}


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f):
        self.f = f
        at = f.tell()
        self.size = f.seek(0, 2)  # every count is checked against what is left of the file
        f.seek(at)

    def left(self) -> int:
        return self.size - self.f.tell()

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise _Truncated
        return b

    def unpack(self, fmt: str, size: int):
        return struct.unpack(fmt, self.take(size))[0]

    def count(self, n: int, each: int, what: str) -> int:
        """A declared count of items of at least `each` bytes: no more than the rest of the file holds."""
        if n * each > self.left():
            raise ValueError(f"{n:,} {what} declared, more than the {self.left():,} bytes left in the file hold")
        return n

    def string(self) -> str:
        n = self.count(self.unpack("<Q", 8), 1, "bytes of a string")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Walk past `count` strings, each checked as string() checks it, without decoding them: a
        vocabulary is most of a header (Gemma-3's 262K tokens took 0.6 s one string() at a time), so
        its lengths are read from a window of the file in one loop."""
        f, end = self.f, self.size
        pos = base = f.tell()
        buf = b""
        for _ in range(count):
            off = pos - base
            if off + 8 > len(buf):
                f.seek(pos)
                buf, base, off = f.read(1 << 20), pos, 0
                if len(buf) < 8:
                    raise _Truncated
            (n,) = _U64.unpack_from(buf, off)
            pos += 8
            if n > end - pos:
                raise ValueError(f"{n:,} bytes of a string declared, more than the {end - pos:,} bytes left in the file hold")
            pos += n
        f.seek(pos)

    def value(self, vtype: int, keep: bool):
        self.last_count = None
        if vtype in _SCALARS:
            return self.unpack(*_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I", 4), self.unpack("<Q", 8)
            if etype == _ARRAY:
                raise ValueError("nested arrays")
            if etype not in _SCALARS and etype != _STRING:
                raise ValueError(f"unknown GGUF value type {etype}")
            self.count(count, _SCALARS[etype][1] if etype in _SCALARS else 8, "array items")
            if not keep:
                if etype in _SCALARS:
                    self.f.seek(_SCALARS[etype][1] * count, 1)
                else:
                    self.skip_strings(count)
                self.last_count = count
                return None
            out = [self.value(etype, keep) for _ in range(count)]
            self.last_count = count
            return out if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor's data lies in the file, as its header says (checked by _check_tensors)."""

    name: str
    dims: tuple[int, ...]  # ggml's order: dims[0] is the length of a row
    gtype: int             # the ggml type id
    offset: int            # bytes from the start of the file
    n_bytes: int


def read_header(path: Path, keep_arrays: frozenset[str] = frozenset()) -> dict:
    """GGUF key/values (arrays omitted unless named in keep_arrays; an omitted array's length is
    under "KEY#count"), after checking the tensor infos as llama.cpp's loader will."""
    return read_gguf(path, keep_arrays)[0]


def read_gguf(path: Path, keep_arrays: frozenset[str] = frozenset()) -> tuple[dict, list[TensorInfo]]:
    """read_header's key/values and the tensors' places in the file (for reading weights without
    gguf-py's reader, which builds an object for every vocabulary entry)."""
    with open(path, "rb", buffering=1 << 16) as f:
        return read_gguf_from(f, path, keep_arrays)


def read_header_from(f, path: Path | str, keep_arrays: frozenset[str] = frozenset()) -> dict:
    """read_header on an open binary file (the part the fuzzer drives, on bytes in memory)."""
    return read_gguf_from(f, path, keep_arrays)[0]


def read_gguf_from(f, path: Path | str, keep_arrays: frozenset[str] = frozenset()) -> tuple[dict, list[TensorInfo]]:
    r = _Reader(f)
    try:
        if r.take(4) != GGUF_MAGIC:
            raise ValueError("bad magic")
        version = r.unpack("<I", 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        n_tensors = r.unpack("<Q", 8)
        n_kv = r.unpack("<Q", 8)
        if n_kv > _MAX_KV:
            raise ValueError(f"{n_kv} key/values")
        r.count(n_kv, _MIN_KV_BYTES, "key/values")
        r.count(n_tensors, _MIN_TENSOR_INFO_BYTES, "tensors")
        out: dict = {"__version__": version}
        counts: dict[str, int] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.unpack("<I", 4)
            val = r.value(vtype, keep=key in keep_arrays)
            if val is not None:
                out[key] = val
            elif r.last_count is not None:  # a skipped array: its length (the vocabulary size)
                counts[key] = r.last_count
                out[f"{key}#count"] = r.last_count
        out["__array_lengths__"] = counts
        alignment = out.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment!r} is not a power of 2")
        return out, _check_tensors(r, r.count(n_tensors, _MIN_TENSOR_INFO_BYTES, "tensors"), alignment)
    except _Truncated:
        raise KvpotError(f"{path} is a truncated GGUF file") from None
    except (ValueError, struct.error) as e:
        raise KvpotError(f"{path} is not a valid GGUF file ({e})") from None


def _check_tensors(r: _Reader, n_tensors: int, alignment: int) -> list[TensorInfo]:
    """The tensor infos, as llama.cpp's GGUF loader checks them (gguf.cpp), and the data they
    describe against the file's size: a file that fails here never reaches the loader."""
    names: set[str] = set()
    infos = []  # (name, dims, type, offset in the data section, bytes)
    data = end = 0  # bytes of the data section so far (each tensor padded to the alignment); the last one's end
    for _ in range(n_tensors):
        name = r.string()
        if len(name.encode()) >= _MAX_NAME:
            raise ValueError(f"tensor name {name[:20]!r}... is {len(name.encode())} bytes (at most {_MAX_NAME - 1})")
        if name in names:
            raise ValueError(f"tensor {name!r} is declared twice")
        names.add(name)
        n_dims = r.unpack("<I", 4)
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
        dims = [r.unpack("<q", 8) for _ in range(n_dims)]
        if any(d < 0 for d in dims):
            raise ValueError(f"tensor {name!r} has a negative dimension {dims}")
        n_elements = 1
        for d in dims:
            n_elements *= d
        gtype = r.unpack("<I", 4)
        if gtype not in _TYPE_SIZES:
            raise ValueError(f"tensor {name!r} has an unknown ggml type {gtype}")
        block, block_bytes = _TYPE_SIZES[gtype]
        if dims and dims[0] % block:
            raise ValueError(f"tensor {name!r} has rows of {dims[0]} elements, not a multiple of its type's block ({block})")
        offset = r.unpack("<Q", 8)
        if offset != data:
            raise ValueError(f"tensor {name!r} starts at data offset {offset}, expected {data}")
        n_bytes = n_elements // block * block_bytes
        infos.append((name, tuple(dims), gtype, offset, n_bytes))
        end = data + n_bytes  # a file may stop right after the last tensor, without its padding
        data += -(-n_bytes // alignment) * alignment
    if n_tensors:
        start = r.size - r.left()
        start += -start % alignment
        if start + end > r.size:
            raise ValueError(f"its {n_tensors} tensors need {end:,} bytes of data from offset {start:,}, "
                             f"past the end of the file ({r.size:,} bytes)")
        return [TensorInfo(name, dims, gtype, start + offset, n_bytes) for name, dims, gtype, offset, n_bytes in infos]
    return []


@dataclass(frozen=True)
class ModelFacts:
    path: Path
    arch: str
    name: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    n_ctx_train: int
    chat_template: str | None
    # what the KV cache costs (kvpot.session.auto_budget): per-head key/value widths, the sliding window (0: none)
    # and which layers use it, the vocabulary (the logits buffer), the file size (the weights)
    head_dim_k: int = 0
    head_dim_v: int = 0
    n_ff: int = 0
    n_vocab: int = 0
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    file_bytes: int = 0


def check_gguf_header(path: Path, what: str = "model") -> None:
    """Existence, type and magic: the cheap checks, with one clear line each."""
    if not path.exists():
        raise KvpotError(f"{what} file {path} does not exist")
    if path.is_dir():
        raise KvpotError(f"{what} path {path} is a directory, not a .gguf file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise KvpotError(f"{what} path {path} is not a regular file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise KvpotError(f"cannot read {what} file {path}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise KvpotError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


def read_model_facts(path: Path) -> ModelFacts:
    """Validate a GGUF model file and read its architecture facts."""
    path = Path(path)
    check_gguf_header(path)
    return model_facts(read_header(path), path, path.stat().st_size)


# what llama.cpp accepts for each fact kvpot sizes memory and graphs from (LLAMA_MAX_LAYERS; heads,
# widths and counts are int32 there): (key, smallest, largest)
_INT32_MAX = 2**31 - 1
_FACT_RANGES = {"block_count": (1, 512), "attention.head_count": (1, 1 << 16), "embedding_length": (1, 1 << 20),
                "attention.head_count_kv": (1, 1 << 16), "attention.key_length": (1, 1 << 16),
                "attention.value_length": (1, 1 << 16), "context_length": (0, _INT32_MAX),
                "feed_forward_length": (0, _INT32_MAX), "vocab_size": (0, _INT32_MAX),
                "attention.sliding_window": (0, _INT32_MAX)}


_ARCH_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _shown(value) -> str:
    """A string from the file, fit for one line of an error (escapes, no newline)."""
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 40 else ascii(value)[:60]


def model_facts(kv: dict, path: Path | str, file_bytes: int) -> ModelFacts:
    """The facts of a model from its GGUF header, each checked against what llama.cpp accepts (the part
    the fuzzer drives after read_header_from): a file that fails is one line, before any C code runs."""
    path = Path(path)
    gtype = kv.get("general.type")
    if gtype not in (None, "model"):
        raise KvpotError(f"{path} is a GGUF {_shown(gtype)}, not a model")
    arch = kv.get("general.architecture")
    if not arch or not isinstance(arch, str):
        raise KvpotError(f"{path} has no general.architecture: not a llama.cpp model")
    if not _ARCH_NAME.match(arch):  # llama.cpp's names are short and plain; this one would also go into messages
        raise KvpotError(f"{path}: general.architecture {ascii(arch[:40])} is not an architecture llama.cpp knows")

    def num(key: str, default: int | None = 0) -> int:
        v = kv.get(f"{arch}.{key}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):  # absent, or per layer (an array): the default
            if default is None:  # llama.cpp's loader needs it
                raise KvpotError(f"{path} has no {arch}.{key} (a number): not a model llama.cpp can load")
            v = default
        lo, hi = _FACT_RANGES[key]
        if not lo <= v <= hi:
            raise KvpotError(f"{path}: {arch}.{key} = {v} is outside what llama.cpp accepts ({lo} to {hi:,})")
        return v

    n_head = num("attention.head_count", None)
    n_head_kv = num("attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise KvpotError(f"{path}: {n_head} attention heads cannot share {n_head_kv} KV heads evenly")
    n_layer = num("block_count", None)
    n_embd = num("embedding_length", None)
    head_dim = max(1, n_embd // n_head)
    window = num("attention.sliding_window")
    name, template = kv.get("general.name"), kv.get("tokenizer.chat_template")
    n_tokens = kv.get("tokenizer.ggml.tokens#count", 0)
    return ModelFacts(
        path=path,
        arch=arch,
        name=name if isinstance(name, str) and name else path.stem,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd=n_embd,
        n_ctx_train=num("context_length"),
        chat_template=template if isinstance(template, str) else None,
        head_dim_k=num("attention.key_length", head_dim),
        head_dim_v=num("attention.value_length", head_dim),
        n_ff=num("feed_forward_length"),
        n_vocab=num("vocab_size") or min(int(n_tokens), _INT32_MAX),
        sliding_window=window,
        swa_layers=swa_layers(arch, n_layer, window, kv.get(f"{arch}.attention.sliding_window_pattern")),
        file_bytes=file_bytes,
    )


# llama.cpp's built-in sliding-window patterns (src/models/*.cpp, load_swa_pattern) for the
# architectures whose GGUF files do not carry attention.sliding_window_pattern: every n-th layer
# is global, the others slide
_SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "cohere2": 4}


def swa_layers(arch: str, n_layer: int, window: int, pattern) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp decides (llama_hparams::set_swa_pattern).
    An unknown pattern counts every layer as global: that overstates the KV a model needs, never
    understates it."""
    if window <= 0 or n_layer <= 0:
        return (False,) * max(n_layer, 0)
    n = pattern if isinstance(pattern, int) else _SWA_PATTERNS.get(arch)
    if n is None:
        return (False,) * n_layer
    return tuple(n == 0 or (il % n < n - 1) for il in range(n_layer))
