"""The CLI and the benchmarks stand on kvpot.api and assemble nothing themselves: no module of cli/, kvpot/bench/
or kvpot/serve/ imports the session, the engine, the policies or the reading's planning and checks (kvpot.api.plan
plans, checks and opens every reading, kvpot.api.engine_plan the bare engine a benchmark measures, and
kvpot.api.Document answers chat's turns). Every module of those folders is walked, so a new one that reaches under
the API fails here. An import under `if TYPE_CHECKING:` names a type for an annotation and builds nothing, so it
is allowed.

Not walked, as they must reach lower: studies/ (outside the package, kvpot never imports them; a study traces the
engine's own steps, a needle's path through compactions) and kvpot/train/ (training a policy's parts drives the
policy and its emulation directly)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FOLDERS = ("cli", "kvpot/bench", "kvpot/serve")
# modules of those folders that must reach under the API, each with why (none now: add one only with its reason)
REACHES_LOWER: dict[str, str] = {}
# what stood on the API when every module was listed by hand: still walked, so a folder's move is noticed
ON_THE_API = [
    "cli/ask.py", "cli/run.py", "cli/serve.py", "cli/_session.py", "cli/_focus.py", "cli/_reread.py", "cli/_report.py",
    "cli/bench.py", "cli/reading.py", "cli/_options.py", "cli/train.py", "cli/doctor.py",
    "kvpot/bench/qa.py", "kvpot/bench/context.py", "kvpot/bench/ruler_run.py", "kvpot/bench/qa_grounded.py",
    "kvpot/bench/qa_read_save.py", "kvpot/bench/throughput.py", "kvpot/bench/grid.py", "kvpot/bench/infllm_cache.py",
    "kvpot/bench/locate.py", "kvpot/serve/backend.py",
]
# what only kvpot.api may put together: a Session, an Engine, a policy, a reading's budget and its refusals
UNDER_THE_API = ("kvpot.session.session", "kvpot.engine", "kvpot.policies", "kvpot.session.reading_plan",
                 "kvpot.session.checks")


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(source: str, name: str = "<module>") -> list[tuple[int, str]]:
    """(line, module) of every import that runs, at the top or inside a function; `from kvpot import engine`
    counts as kvpot.engine. Imports under `if TYPE_CHECKING:` are left out (they never run)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for other in node.orelse:
                visit(other)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, name))
    return out


def under_the_api(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in UNDER_THE_API)


def walked() -> list[str]:
    """Every module of FOLDERS but those that must reach lower."""
    found = sorted(str(p.relative_to(ROOT)) for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
                   if "__pycache__" not in p.parts)
    return [rel for rel in found if rel not in REACHES_LOWER]


def test_every_command_and_bench_module_is_walked():
    modules = walked()
    assert len(modules) > 50  # the walk found the folders
    assert set(ON_THE_API) <= set(modules), sorted(set(ON_THE_API) - set(modules))
    assert set(REACHES_LOWER) <= {str(p.relative_to(ROOT)) for f in FOLDERS for p in (ROOT / f).rglob("*.py")}


def test_the_commands_and_benches_import_nothing_under_the_api():
    found = []
    for rel in walked():
        path = ROOT / rel
        found += [f"{rel}:{line} imports {name}" for line, name in imports(path.read_text(), str(path))
                  if under_the_api(name)]
    assert not found, found


def test_the_walk_sees_what_assembles_and_leaves_out_annotations():
    code = ("from typing import TYPE_CHECKING\n"
            "from kvpot.session.session import Session\n"
            "from kvpot import engine\n"
            "if TYPE_CHECKING:\n"
            "    from kvpot.engine import Engine\n"
            "else:\n"
            "    import kvpot.session.checks\n"
            "def f():\n"
            "    from kvpot.policies import make_policy\n"
            "    from kvpot.api.plan import plan_read\n")
    caught = sorted({name for _, name in imports(code) if under_the_api(name)})
    assert caught == ["kvpot.engine", "kvpot.policies", "kvpot.policies.make_policy", "kvpot.session.checks",
                      "kvpot.session.session", "kvpot.session.session.Session"]
