"""Read the tensors of a PyTorch checkpoint (torch.save's zip format) without torch and without
running anything the file asks for.

A torch checkpoint is a zip holding `<name>/data.pkl` (a pickle) and `<name>/data/<key>` (raw
storage bytes). Unpickling with the stdlib would import and call whatever the pickle names, which
is how a malicious checkpoint runs code. This reader's unpickler resolves only the handful of names
a state dict of plain tensors needs (an OrderedDict, torch's tensor-rebuild function, storage dtype
tags) to inert stand-ins; any other global, and any persistent id that is not a storage, is
refused before anything is built. Tensors come back as NumPy arrays (bf16 widened to float32).
"""

from __future__ import annotations

import io
import pickle
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


def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    """Stand-in for torch._utils._rebuild_tensor_v2: remembers what to view, builds nothing."""
    return ("tensor", storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


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
        return _StorageRef(tag.name, str(key), int(numel))


def _archive_prefix(zf: zipfile.ZipFile) -> str:
    pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        raise CheckpointError("not a torch checkpoint: no single <name>/data.pkl in the archive")
    return pkls[0][: -len("data.pkl")]


def _materialise(zf: zipfile.ZipFile, prefix: str, spec, cache: dict) -> np.ndarray:
    _, ref, offset, size, stride = spec
    if not isinstance(ref, _StorageRef):
        raise CheckpointError("the checkpoint holds a tensor without storage")
    dtype = _STORAGES[ref.tag]
    if ref.key not in cache:
        try:
            raw = zf.read(f"{prefix}data/{ref.key}")
        except KeyError:
            raise CheckpointError(f"the checkpoint lacks the data of storage {ref.key}") from None
        if len(raw) != ref.numel * dtype.itemsize:
            raise CheckpointError(f"storage {ref.key} holds {len(raw)} bytes, expected {ref.numel * dtype.itemsize}")
        cache[ref.key] = np.frombuffer(raw, dtype=dtype)
    flat = cache[ref.key]
    if any(s < 0 for s in stride) or any(n < 0 for n in size):
        raise CheckpointError("a tensor has a negative size or stride")
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    if offset < 0 or offset + span > flat.size:
        raise CheckpointError(f"a tensor reaches past the end of storage {ref.key}")
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=size,
                                           strides=tuple(s * dtype.itemsize for s in stride), writeable=False)
    arr = np.array(view)  # a copy: the storage buffer is not kept alive by the result
    if ref.tag == "BFloat16Storage":
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
            obj = _WeightsOnlyUnpickler(io.BytesIO(zf.read(prefix + "data.pkl"))).load()
            if not isinstance(obj, dict):
                raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
            cache: dict = {}
            out = {}
            for name, spec in obj.items():
                if not (isinstance(spec, tuple) and spec and spec[0] == "tensor"):
                    raise CheckpointError(f"{path}: entry {name!r} is not a tensor")
                out[str(name)] = _materialise(zf, prefix, spec, cache)
            return out
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, OverflowError, MemoryError, RecursionError) as e:
        raise CheckpointError(f"{path} is not a readable torch checkpoint ({type(e).__name__}: {e})") from None
