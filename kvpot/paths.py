"""Where kvpot keeps its files: KVPOT_HOME, else $XDG_CACHE_HOME/kvpot, else ~/.cache/kvpot.

Every path under it comes from `home()`, which checks the folder first: one that exists as something
other than a folder (or lies under a file) is refused with one line naming it, before any work, rather
than failing later as a missing model, a NotADirectoryError or a FileExistsError mid-read. The folder
itself may not exist yet: whatever writes under it creates it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvpot.errors import KvpotError


def _source() -> tuple[Path, str]:
    """kvpot's home and where that choice came from (for the refusal)."""
    explicit = os.environ.get("KVPOT_HOME")
    if explicit:
        return Path(explicit).expanduser(), "KVPOT_HOME"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "kvpot", "XDG_CACHE_HOME"
    return Path.home() / ".cache" / "kvpot", "the default kvpot home"


def _check_folder(path: Path, what: str) -> None:
    """`path` is a folder, or does not exist and could be made (its nearest existing parent is a folder)."""
    probe = path
    while True:
        try:
            st = probe.stat()
        except FileNotFoundError:
            if probe.parent == probe:
                return
            probe = probe.parent
            continue
        except NotADirectoryError:  # a component above is a file: find which one
            probe = probe.parent
            continue
        except OSError as e:
            raise KvpotError(f"{what} {path} cannot be used: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            where = "" if probe == path else f" ({probe} is not a folder)"
            raise KvpotError(f"{what} {path} is not a folder{where}; point it at a folder")
        return


def home() -> Path:
    path, source = _source()
    _check_folder(path, f"kvpot's home ({source})" if source != "KVPOT_HOME" else "KVPOT_HOME")
    return path


def models_dir() -> Path:
    return home() / "models"


def build_dir() -> Path:
    """Build cache: the sdist, the extracted and patched trees, cmake's build dir, wheels."""
    return home() / "build"


def bench_reads_dir() -> Path:
    """`bench throughput`'s long reads, saved as they go (kvpot.bench.read_checkpoint)."""
    return home() / "bench-reads"


def blocks_dir(create: bool = False) -> Path:
    """InfLLM's block stores (`infllm:store=PATH` puts one elsewhere); `create` makes the folder (kvpot's
    own, under its home: a folder a user named is never created)."""
    path = home() / "blocks"
    _check_folder(path, "the block store folder (KVPOT_HOME/blocks)")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise KvpotError(f"cannot make the block store folder {path}: {e.strerror}") from None
    return path
