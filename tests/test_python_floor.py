"""requires-python is true: vermin finds nothing in kvpot's sources (the package, cli/, converters/, models/)
that needs a newer Python than pyproject.toml's floor. kvpot imported tomllib (3.11) while saying 3.10, so
on Ubuntu 22.04's Python every command failed at import. A line marked `# novm` has a fallback beside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_sources_run_on_the_oldest_python_pyproject_allows():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = re.fullmatch(r">=\s*(3\.[0-9]+)", spec.strip())[1]
    res = subprocess.run([sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", "--no-tips",
                          "--eval-annotations", "--violations", f"-t={floor}-", "kvpot", "cli", "converters", "studies",
                          "models"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "not met" not in res.stdout, res.stdout + res.stderr
    assert "Analyzing" in res.stdout  # it read the files
