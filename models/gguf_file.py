"""Check a GGUF file in Python before any of it reaches llama.cpp, and read the facts kvpot needs.

A small reader of the GGUF header (key/value section only): gguf-py's GGUFReader builds
objects for every vocabulary entry and takes ~20 s on Gemma's 262K-token vocabulary,
while this skips arrays it does not need.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from kvpot.errors import KvpotError

GGUF_MAGIC = b"GGUF"

# GGUF value types: id -> (struct format, size) for fixed-size scalars
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_MAX_KV = 1 << 20


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise _Truncated
        return b

    def unpack(self, fmt: str, size: int):
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.unpack("<Q", 8)
        if n > 1 << 30:
            raise ValueError(f"string length {n}")
        return self.take(n).decode("utf-8", errors="replace")

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
            if count > 1 << 32:
                raise ValueError(f"array of {count} items")
            if etype in _SCALARS and not keep:
                self.f.seek(_SCALARS[etype][1] * count, 1)
                self.last_count = count
                return None
            out = [self.value(etype, keep) for _ in range(count)]
            self.last_count = count
            return out if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_header(path: Path, keep_arrays: frozenset[str] = frozenset()) -> dict:
    """GGUF key/values (arrays omitted unless named in keep_arrays; an omitted array's length is
    under "KEY#count")."""
    with open(path, "rb", buffering=1 << 16) as f:
        return read_header_from(f, path, keep_arrays)


def read_header_from(f, path: Path | str, keep_arrays: frozenset[str] = frozenset()) -> dict:
    """read_header on an open binary file (the part the fuzzer drives, on bytes in memory)."""
    r = _Reader(f)
    try:
        if r.take(4) != GGUF_MAGIC:
            raise ValueError("bad magic")
        version = r.unpack("<I", 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        r.unpack("<Q", 8)  # tensor count
        n_kv = r.unpack("<Q", 8)
        if n_kv > _MAX_KV:
            raise ValueError(f"{n_kv} key/values")
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
        return out
    except _Truncated:
        raise KvpotError(f"{path} is a truncated GGUF file") from None
    except (ValueError, struct.error) as e:
        raise KvpotError(f"{path} is not a valid GGUF file ({e})") from None


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
    kv = read_header(path)
    gtype = kv.get("general.type")
    if gtype not in (None, "model"):
        raise KvpotError(f"{path} is a GGUF {gtype}, not a model")
    arch = kv.get("general.architecture")
    if not arch:
        raise KvpotError(f"{path} has no general.architecture: not a llama.cpp model")

    def num(key: str, default: int = 0) -> int:
        v = kv.get(f"{arch}.{key}")
        return int(v) if isinstance(v, (int, float)) else default

    n_head = num("attention.head_count")
    n_layer = num("block_count")
    n_embd = num("embedding_length")
    head_dim = n_embd // n_head if n_head else 0
    window = num("attention.sliding_window")
    return ModelFacts(
        path=path,
        arch=arch,
        name=kv.get("general.name") or path.stem,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=num("attention.head_count_kv", n_head),
        n_embd=n_embd,
        n_ctx_train=num("context_length"),
        chat_template=kv.get("tokenizer.chat_template"),
        head_dim_k=num("attention.key_length", head_dim),
        head_dim_v=num("attention.value_length", head_dim),
        n_ff=num("feed_forward_length"),
        n_vocab=num("vocab_size") or int(kv.get("tokenizer.ggml.tokens#count", 0)),
        sliding_window=window,
        swa_layers=swa_layers(arch, n_layer, window, kv.get(f"{arch}.attention.sliding_window_pattern")),
        file_bytes=path.stat().st_size,
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
