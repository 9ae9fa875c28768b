"""Where kvpot keeps its files: KVPOT_HOME, else $XDG_CACHE_HOME/kvpot, else ~/.cache/kvpot."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    explicit = os.environ.get("KVPOT_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvpot"


def models_dir() -> Path:
    return home() / "models"


def build_dir() -> Path:
    """Build cache: the sdist, the extracted and patched trees, cmake's build dir, wheels."""
    return home() / "build"


def blocks_dir() -> Path:
    """InfLLM's block stores (`infllm:store=PATH` puts one elsewhere)."""
    return home() / "blocks"
