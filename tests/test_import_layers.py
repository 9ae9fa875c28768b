"""The library never imports the terminal's layer: no module of kvpot/ (the package, the API included) imports
kvpot.cli (cli/ at the top of the repository), at its top or inside a function. The CLI stands on the library,
never the other way round (the terminal's ways of saying things reach the library as callbacks)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_the_library_never_imports_the_cli():
    library = [p for p in (ROOT / "kvpot").rglob("*.py") if "__pycache__" not in p.parts]
    assert len(library) > 50  # the walk found the package
    upward = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in library for line, name in _imports(p)
              if name == "cli" or name.startswith(("cli.", "kvpot.cli"))]
    assert not upward, upward


def test_the_walk_sees_an_import_inside_a_function(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from kvpot.cli._focus import find_passages\n    import cli.ask\n")
    assert [n for _, n in _imports(bad)] == ["kvpot.cli._focus", "cli.ask"]
