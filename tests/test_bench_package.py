"""kvpot/bench holds the benchmarks `kvpot bench` runs; the studies behind a decision sit in studies/ at the
repository's top. kvpot never imports a study (an installed kvpot has no studies/), every `python -m MODULE`
the Makefile runs names a file that exists, and studies/README.md lists every study there is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the folders installed as kvpot (pyproject.toml's package-dir)
PACKAGE_DIRS = {"kvpot": "kvpot", "kvpot.cli": "cli", "kvpot.models": "models", "kvpot.converters": "converters"}
OURS = re.compile(r"-m\s+((?:kvpot|studies)(?:\.\w+)+)")


def study_imports(source: str, name: str) -> list[str]:
    """`line: statement` of every import of the studies package in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        if any(m == "studies" or m.startswith("studies.") for m in mods):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def module_file(module: str) -> Path:
    """The source file of a dotted module of this repository (a package's __init__.py, or MODULE.py)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):  # the longest package-dir prefix places the rest
        prefix = ".".join(parts[:n])
        if prefix in PACKAGE_DIRS:
            base = REPO / PACKAGE_DIRS[prefix] / Path(*parts[n:]) if parts[n:] else REPO / PACKAGE_DIRS[prefix]
            break
    else:
        base = REPO / Path(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_the_import_walk_sees_every_form_of_import():
    src = "import os\nimport studies.curve\nfrom studies import curve\nfrom kvpot.bench import niah\n" \
          "def f():\n    from studies.curve import load\n"
    assert [line.split(":")[0] for line in study_imports(src, "x.py")] == ["2", "3", "6"]
    assert study_imports("from . import studies\nimport studiesx\n", "y.py") == []


def test_kvpot_never_imports_a_study():
    hits = []
    for folder in sorted(set(PACKAGE_DIRS.values())):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            hits += [f"{rel}:{hit}" for hit in study_imports(path.read_text(), rel)]
    assert not hits, "kvpot imports studies/ (not installed with it):\n" + "\n".join(hits)


def test_module_paths_resolve_as_the_package_dirs_say():
    assert module_file("kvpot.bench.niah") == REPO / "kvpot" / "bench" / "niah.py"
    assert module_file("kvpot.cli.main") == REPO / "cli" / "main.py"
    assert module_file("studies.curve") == REPO / "studies" / "curve.py"
    assert module_file("studies") == REPO / "studies" / "__init__.py"


def test_every_module_the_makefile_runs_exists():
    text = (REPO / "Makefile").read_text()
    modules = sorted(set(OURS.findall(text)))
    assert any(m.startswith("studies.") for m in modules) and any(m.startswith("kvpot.bench.") for m in modules)
    missing = [m for m in modules if not module_file(m).is_file()]
    assert not missing, f"the Makefile runs modules with no file: {missing}"


def test_the_studies_readme_lists_every_study():
    listed = set(re.findall(r"^\| `(\w+)` \|", (REPO / "studies" / "README.md").read_text(), re.M))
    there = {p.stem for p in (REPO / "studies").glob("*.py") if p.stem != "__init__"}
    assert listed == there
