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
