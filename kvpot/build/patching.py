"""Apply patches/series to a llama.cpp tree; a patch that does not apply stops the build by name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kvpot.errors import BuildError


def read_series(patches_dir: Path) -> list[Path]:
    """Patch files in the order of `series` (blank lines and # comments ignored)."""
    series = patches_dir / "series"
    if not series.is_file():
        raise BuildError(f"{series}: missing patch series file")
    out = []
    for raw in series.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = patches_dir / name
        if not path.is_file():
            raise BuildError(f"patch {name} is listed in {series} but does not exist")
        out.append(path)
    return out


def apply_series(patches_dir: Path, tree: Path) -> list[str]:
    """Apply every patch with `patch -p1 --fuzz=0` (the source is pinned: context must match exactly), dry run first."""
    if shutil.which("patch") is None:
        raise BuildError("the `patch` program is needed to build kvpot (apt install patch / pkg install patch)")
    applied = []
    for path in read_series(patches_dir):
        for dry in (True, False):
            cmd = ["patch", "-p1", "--fuzz=0", "--batch", "--forward", "--no-backup-if-mismatch", "-s", "-d", str(tree), "-i", str(path)]
            if dry:
                cmd.insert(1, "--dry-run")
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                detail = (res.stdout + res.stderr).strip().splitlines()
                first = detail[0] if detail else f"exit {res.returncode}"
                raise BuildError(f"patch {path.name} does not apply to the pinned llama.cpp: {first}")
        applied.append(path.name)
    return applied
