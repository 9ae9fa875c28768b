"""Read the tensors of a PyTorch checkpoint (torch.save's zip format) without torch and without
running anything the file asks for.

A torch checkpoint is a zip holding `<name>/data.pkl` (a pickle) and `<name>/data/<key>` (raw
storage bytes). Unpickling with the stdlib would import and call whatever the pickle names, which
is how a malicious checkpoint runs code. This reader's unpickler resolves only the handful of names
a state dict of plain tensors needs (an OrderedDict, torch's tensor-rebuild function, storage dtype
tags) to inert stand-ins; any other global, and any persistent id that is not a storage, is
refused before anything is built. Tensors come back as NumPy arrays (bf16 widened to float32).

Memory stays within what the tensors really hold: every declared size is checked before anything
is allocated or decompressed. The pickle is small and scanned opcode by opcode before it runs (the
C unpickler allocates whatever a length or memo index says); each tensor's shape and stride must
fit its storage without overlapping itself, the tensors together may not hold more than their
storages do, a storage entry's declared size must be its element count, and storages are
decompressed in bounded pieces, only as far as the tensors reach.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError

# torch storage type tag -> (dtype of the raw bytes, how to widen it)
_STORAGES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"),  # widened to float32 below
    "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
}
# a state dict's pickle holds names, shapes and storage ids, ~150 bytes a tensor: a Locret checkpoint's
# is a few KB. The bound keeps what unpickling builds (at most tens of bytes an opcode) small
MAX_PICKLE_BYTES = 1 << 20
_MAX_NDIM = 8
_PIECE = 1 << 20  # bytes decompressed at a time
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class CheckpointError(KvpotError):
    """The file is not a checkpoint this reader loads (or asks for something it will not do)."""


@dataclass(frozen=True)
class _StorageTag:
    name: str


@dataclass(frozen=True)
class _StorageRef:
    tag: str
    key: str
    numel: int


@dataclass(frozen=True)
class _Tensor:
    """A view the pickle asks for: storage, offset, size and stride in elements, all checked."""

    ref: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    @property
    def end(self) -> int:
        """One past the last storage element the view reads (its offset when it is empty)."""
        if not self.numel:
            return self.offset
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride))


def _whole(x, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise CheckpointError(f"the checkpoint gives a tensor a {what} of {str(x)[:40]!r}, not a whole number")
    return x


def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    """Stand-in for torch._utils._rebuild_tensor_v2: remembers what to view, builds nothing."""
    if not isinstance(storage, _StorageRef):
        raise CheckpointError("the checkpoint holds a tensor without storage")
    if not isinstance(size, tuple | list) or not isinstance(stride, tuple | list):
        raise CheckpointError("the checkpoint gives a tensor a size or stride that is not a tuple")
    if len(size) != len(stride) or len(size) > _MAX_NDIM:
        raise CheckpointError(f"the checkpoint gives a tensor {len(size)} sizes and {len(stride)} strides "
                              f"(at most {_MAX_NDIM} dimensions are read)")
    return _Tensor(storage, _whole(offset, "storage offset"), tuple(_whole(n, "size") for n in size),
                   tuple(_whole(s, "stride") for s in stride))


def _rebuild_parameter(data, *_ignored):
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageTag(name) for name in _STORAGES},
}


class _WeightsOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise CheckpointError(f"the checkpoint asks for {module}.{name}, which a weights-only reader does not "
                                  "load (only tensors in an OrderedDict are read)") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageTag)):
            raise CheckpointError(f"the checkpoint holds an object kvpot does not read ({str(pid)[:60]})")
        _, tag, key, _location, numel = pid
        numel = _whole(numel, "storage size")
        if numel < 0:
            raise CheckpointError(f"storage {str(key)[:40]} has a negative size")
        return _StorageRef(tag.name, str(key), numel)


def _scan_pickle(data: bytes) -> None:
    """Walk the opcodes without running them: every length field is checked against the bytes that
    follow, and a memo index larger than the pickle could fill (the unpickler would allocate that
    many slots) is refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a STRING opcode's bad escape: a warning while decoding, not ours to show
            for op, arg, _pos in pickletools.genops(data):
                if op.name in _MEMO_PUTS and not 0 <= int(arg) <= len(data):
                    raise CheckpointError(f"the checkpoint's pickle stores an object at memo index {arg}, "
                                          f"more than its {len(data)} bytes could fill")
    except CheckpointError:
        raise
    except Exception as e:  # pickletools raises ValueError and others on bytes that are not a pickle
        raise CheckpointError(f"the checkpoint's pickle is damaged ({type(e).__name__}: {str(e)[:80]})") from None


def _archive_prefix(zf: zipfile.ZipFile) -> str:
    pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        raise CheckpointError("not a torch checkpoint: no single <name>/data.pkl in the archive")
    return pkls[0][: -len("data.pkl")]


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, n: int) -> bytearray:
    """The first n bytes of an entry (n <= its declared size), decompressed in bounded pieces; the
    buffer grows with what arrives, so an entry that declares more than it holds costs only what it holds."""
    buf = bytearray()
    with zf.open(info) as f:
        while len(buf) < n:
            piece = f.read(min(_PIECE, n - len(buf)))
            if not piece:
                raise CheckpointError(f"{info.filename} holds {len(buf)} bytes, its header says {info.file_size}")
            buf += piece
    return buf


def _read_pickle(zf: zipfile.ZipFile, prefix: str):
    info = zf.getinfo(prefix + "data.pkl")
    if info.file_size > MAX_PICKLE_BYTES:
        raise CheckpointError(f"the checkpoint's pickle is {info.file_size:,} bytes; a state dict of tensors "
                              f"takes far less (at most {MAX_PICKLE_BYTES:,} are read)")
    data = bytes(_read_entry(zf, info, info.file_size))
    _scan_pickle(data)
    return _WeightsOnlyUnpickler(io.BytesIO(data)).load()


def _overlaps(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether two elements of the view share a storage element (dimensions taken by stride)."""
    reach = 0  # the largest offset the smaller-strided dimensions reach
    for n, s in sorted(((n, s) for n, s in zip(size, stride) if n > 1), key=lambda d: d[1]):
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def _check_tensor(name: str, t: _Tensor) -> None:
    if t.ref.tag not in _STORAGES:
        raise CheckpointError(f"tensor {name!r} has storage type {t.ref.tag}, which this reader does not read")
    if t.offset < 0 or any(n < 0 for n in t.size) or any(s < 0 for s in t.stride):
        raise CheckpointError(f"tensor {name!r} has a negative offset, size or stride")
    if t.numel and _overlaps(t.size, t.stride):
        raise CheckpointError(f"tensor {name!r} of shape {list(t.size)} and stride {list(t.stride)} reads its "
                              "storage elements more than once (not a tensor torch.save writes)")
    if t.end > t.ref.numel:
        raise CheckpointError(f"tensor {name!r} reaches element {t.end} of storage {t.ref.key}, which holds "
                              f"{t.ref.numel}")


def _tensors(obj, where: Path) -> dict[str, _Tensor]:
    """The state dict's views, each checked, and the storages they share checked to agree."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where} holds a {type(obj).__name__}, not a state dict of tensors")
    out: dict[str, _Tensor] = {}
    storages: dict[str, _StorageRef] = {}
    for name, t in obj.items():
        if not isinstance(t, _Tensor):
            raise CheckpointError(f"{where}: entry {str(name)[:60]!r} is not a tensor")
        _check_tensor(str(name), t)
        if storages.setdefault(t.ref.key, t.ref) != t.ref:
            raise CheckpointError(f"{where}: storage {t.ref.key} is declared twice with different types or sizes")
        out[str(name)] = t
    held = sum(r.numel * _STORAGES[r.tag].itemsize for r in storages.values())
    viewed = sum(t.numel * _STORAGES[t.ref.tag].itemsize for t in out.values())
    if viewed > held:
        raise CheckpointError(f"{where}: the tensors view {viewed:,} bytes of storages that hold {held:,} "
                              "(the same data viewed many times over)")
    return out


def _storages(zf: zipfile.ZipFile, prefix: str, tensors: dict[str, _Tensor]) -> dict[str, np.ndarray]:
    """Each storage's elements as far as its tensors reach, after its entry's declared size is checked."""
    reach: dict[str, tuple[_StorageRef, int]] = {}
    for t in tensors.values():
        ref, end = reach.get(t.ref.key, (t.ref, 0))
        reach[t.ref.key] = (ref, max(end, t.end))
    out = {}
    for key, (ref, end) in reach.items():
        dtype = _STORAGES[ref.tag]
        try:
            info = zf.getinfo(f"{prefix}data/{key}")
        except KeyError:
            raise CheckpointError(f"the checkpoint lacks the data of storage {key}") from None
        if info.file_size != ref.numel * dtype.itemsize:
            raise CheckpointError(f"storage {key} holds {info.file_size:,} bytes, expected "
                                  f"{ref.numel * dtype.itemsize:,} ({ref.numel:,} elements of {ref.tag})")
        out[key] = np.frombuffer(_read_entry(zf, info, end * dtype.itemsize), dtype=dtype)
    return out


def _materialise(t: _Tensor, flat: np.ndarray) -> np.ndarray:
    dtype = flat.dtype
    view = np.lib.stride_tricks.as_strided(flat[t.offset:], shape=t.size,
                                           strides=tuple(s * dtype.itemsize for s in t.stride), writeable=False)
    arr = np.array(view)  # a copy: the storage buffer is not kept alive by the result
    if t.ref.tag == "BFloat16Storage":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """name -> array for every tensor of a torch.save()'d state dict; CheckpointError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist or is not a file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a torch checkpoint in the zip format of torch.save (torch >= 1.6); "
                              "legacy or other formats are not read")
    try:
        with zipfile.ZipFile(path) as zf:
            prefix = _archive_prefix(zf)
            tensors = _tensors(_read_pickle(zf, prefix), path)
            flats = _storages(zf, prefix, tensors)
            return {name: _materialise(t, flats[t.ref.key]) for name, t in tensors.items()}
    except CheckpointError as e:
        raise CheckpointError(_one_line(str(e) if str(path) in str(e) else f"{path}: {e}")) from None
    except Exception as e:  # zipfile, zlib, lzma and the unpickler raise many kinds; all mean a damaged file
        raise CheckpointError(_one_line(f"{path} is not a readable torch checkpoint ({type(e).__name__}: "
                                        f"{str(e)[:80]})")) from None


def _one_line(text: str) -> str:
    """Names the pickle chose (a global, a key) may hold line breaks; the error stays one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
