"""The lowest version of each dependency pyproject.toml allows, as pip requirements (`name==floor`), for
`make test-floors`: a user whose environment already holds an older package keeps it, so the floors must
run. llama-cpp-python is left out (kvpot builds its own patched one); a dependency without a floor too, and one
whose environment marker excludes the running Python."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib
from packaging.markers import Marker

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floors(pyproject: Path = PYPROJECT) -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        spec, _, marker = dep.partition(";")
        if marker and not Marker(marker).evaluate():
            continue  # not for this Python (tomli on 3.10)
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][A-Za-z0-9.]*)\s*", spec)
        if m and m[1] != "llama-cpp-python":
            out.append(f"{m[1]}=={m[2]}")
    return out


if __name__ == "__main__":
    print(" ".join(floors(Path(sys.argv[1]) if len(sys.argv) > 1 else PYPROJECT)))
