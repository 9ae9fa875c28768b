"""SHA-256 of model files, cached by (path, size, mtime) in the kvpot home so saving and reopening
a context does not re-hash a model that has not changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvpot import paths
from kvpot.hashing import sha256_file


def _cache_file() -> Path:
    return paths.home() / "model-hashes.json"


def model_sha256(path: Path) -> str:
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = _cache_file()
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    digest = sha256_file(path)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}|")}
    cache[key] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_file)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return cache[key]
