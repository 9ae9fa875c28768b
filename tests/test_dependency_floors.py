"""tests/dependency_floors.py, which `make test-floors` installs from: every dependency but the runtime has a
floor, and the floors are read from pyproject.toml as written."""

from __future__ import annotations

import tomllib
from dependency_floors import PYPROJECT, floors
from packaging.markers import Marker


def test_every_dependency_has_a_floor():
    deps = [d for d in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
            if ";" not in d or Marker(d.partition(";")[2]).evaluate()]
    names = [f.split("==")[0] for f in floors()]
    assert len(names) == len(deps) - 1 and "llama-cpp-python" not in names
    for dep in deps:
        name = dep.split(">=")[0].split("==")[0].strip()
        assert name == "llama-cpp-python" or name in names, dep


def test_floors_from_a_pyproject(tmp_path):
    p = tmp_path / "pyproject.toml"
    p.write_text('[project]\ndependencies = ["llama-cpp-python==0.3.36", "numpy>=1.24", "rich >= 13.1",'
                 ' "typer>=0.16; python_version >= \'3.9\'", "tomli>=1.1; python_version < \'3.0\'", "other"]\n')
    assert floors(p) == ["numpy==1.24", "rich==13.1", "typer==0.16"]
