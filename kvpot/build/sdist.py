"""Fetch, verify and extract the pinned llama-cpp-python sdist."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from kvpot.build.pins import SDIST_FILE, SDIST_NAME, SDIST_SHA256, SDIST_VERSION
from kvpot.errors import BuildError
from kvpot.hashing import sha256_file

# PEP 691 JSON form of the simple index (the one PyPI mirrors and proxies serve);
# PIP_INDEX_URL points it at another index
SIMPLE_INDEX = "https://pypi.org/simple"


def verify_sdist(path: Path, expected: str = SDIST_SHA256) -> None:
    """Refuse (and delete) an sdist whose hash is not the pinned one."""
    got = sha256_file(path)
    if got != expected:
        path.unlink(missing_ok=True)
        raise BuildError(
            f"{path.name}: sha256 {got[:16]}… does not match the pinned {expected[:16]}…; "
            "the file was removed, run the build again to download it afresh"
        )


def _sdist_url() -> str:
    index = os.environ.get("PIP_INDEX_URL", SIMPLE_INDEX).rstrip("/")
    url = f"{index}/{SDIST_NAME}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            meta = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BuildError(
            f"cannot read {url} to fetch {SDIST_FILE} ({e}); "
            "put the file in place with KVPOT_SDIST=/path/to/" + SDIST_FILE
        ) from None
    for entry in meta.get("files", []):
        if entry.get("filename") == SDIST_FILE:
            return entry["url"]
    raise BuildError(f"{url} lists no {SDIST_FILE}")


def _download(url: str, dest: Path) -> None:
    part = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as out:
            total = int(r.headers.get("Content-Length") or 0)
            done = 0
            while block := r.read(1 << 20):
                out.write(block)
                done += len(block)
                if total and sys.stderr.isatty():
                    print(f"\rdownloading {dest.name}: {done * 100 // total}%", end="", file=sys.stderr)
        if total and sys.stderr.isatty():
            print(file=sys.stderr)
    except (urllib.error.URLError, OSError) as e:
        part.unlink(missing_ok=True)
        raise BuildError(f"download of {dest.name} failed: {e}") from None
    os.replace(part, dest)


def fetch_sdist(cache: Path) -> Path:
    """Return a verified sdist: KVPOT_SDIST if set, else the cached copy, else a fresh download."""
    explicit = os.environ.get("KVPOT_SDIST")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise BuildError(f"KVPOT_SDIST={explicit}: no such file")
        got = sha256_file(path)
        if got != SDIST_SHA256:
            raise BuildError(f"KVPOT_SDIST={explicit}: sha256 {got[:16]}… is not the pinned {SDIST_SHA256[:16]}…")
        return path
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / SDIST_FILE
    if not dest.exists():
        _download(_sdist_url(), dest)
    verify_sdist(dest)
    return dest


def extract_pristine(sdist: Path, root: Path) -> Path:
    """Extract once per sdist hash; a marker file says the extraction finished."""
    out = root / f"pristine-{SDIST_SHA256[:12]}"
    marker = out / ".kvpot-extracted"
    if marker.exists():
        return out / f"llama_cpp_python-{SDIST_VERSION}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(out, filter="data")
    marker.write_text(SDIST_SHA256 + "\n")
    return out / f"llama_cpp_python-{SDIST_VERSION}"
