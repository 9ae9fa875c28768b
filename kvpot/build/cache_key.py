"""The wheel cache key: sdist hash + patches + ggml_ext/ sources + CMake arguments + native CPU target
+ recipe version."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvpot.build.patching import read_series
from kvpot.build.pins import SDIST_SHA256

# bump when the build recipe itself changes in a way that alters the wheel
RECIPE_VERSION = "1"


def _ext_files(ext_dir: Path) -> list[Path]:
    return sorted(p for p in ext_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def cache_key(patches_dir: Path, ext_dir: Path, cmake_args: str, native: str = "portable",
              sdist_sha256: str = SDIST_SHA256) -> str:
    """native: NativeTarget.fingerprint of the CPU the build compiles for ("portable" without -march=native)."""
    h = hashlib.sha256()

    def feed(tag: str, data: bytes) -> None:
        # length-prefixed so that moving bytes between fields changes the key
        h.update(f"{tag}:{len(data)}:".encode())
        h.update(data)

    feed("recipe", RECIPE_VERSION.encode())
    feed("sdist", sdist_sha256.encode())
    feed("series", (patches_dir / "series").read_bytes())
    for p in read_series(patches_dir):
        feed("patch:" + p.name, p.read_bytes())
    for p in _ext_files(ext_dir):
        feed("ext:" + p.relative_to(ext_dir).as_posix(), p.read_bytes())
    feed("cmake", " ".join(cmake_args.split()).encode())
    feed("native", native.encode())
    return h.hexdigest()
