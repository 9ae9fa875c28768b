"""The import graph of kvpot (kvpot/, cli/, models/, converters/) has no cycle and goes one way, down the layers
of docs/architecture.md, and every module imports on its own in a fresh interpreter.

The walk reads every import statement, inside functions and `if TYPE_CHECKING:` blocks included (a module-level
`__getattr__`, kvpot/__init__.py's lazy API names, too): an import moved into a function is still an edge, so
putting it there cannot hide a cycle. `from a import b` is an import of a.b where that is a module, else of a.
An import inside a function is allowed only where it keeps something heavy from loading until it is used: the
front ends' command modules (FRONT_ENDS) and the modules in HEAVY, each with the reason."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the folders installed as kvpot (pyproject.toml's package-dir)
PACKAGE_DIRS = {"kvpot": "kvpot", "kvpot.cli": "cli", "kvpot.models": "models", "kvpot.converters": "converters"}

# top to bottom: a folder (kvpot.X, a package or a single module; "kvpot" is the package root, the API's door)
# imports only folders of the layers below its own. Folders of one layer do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("kvpot.cli",),                                                   # the terminal
    ("kvpot", "kvpot.bench", "kvpot.serve", "kvpot.train"),            # the other front ends, `import kvpot`
    ("kvpot.api",),                                                   # the front door: Model, Document, Plan
    ("kvpot.session",),                                               # one conversation: settings, checks, Session
    ("kvpot.engine",),                                                # chunks in, policy hooks, compaction
    ("kvpot.state",),                                                 # the engine's saved state
    ("kvpot.locator", "kvpot.policies"),                              # where passages lie; what the pot keeps
    ("kvpot.converters",),                                            # trained adapters' types and format
    ("kvpot.build", "kvpot.ingest", "kvpot.models", "kvpot.runtime"),  # build, inputs, model files, bindings
    ("kvpot.display", "kvpot.hashing", "kvpot.paths", "kvpot.safe_write", "kvpot.wording"),
    ("kvpot.errors", "kvpot.version"),
]

# imports inside a function that stay there, by the importing folder: a front end loads a command's modules when
# the command runs, so `kvpot --help` (tests/test_cli_help.py) and a command that needs no model load neither the
# runtime nor the benchmarks
FRONT_ENDS = {
    "kvpot.cli": "every command module is imported to build `kvpot --help`; what a command runs loads when it runs",
    "kvpot.bench": "the bench's parent process plans, measures stock llama.cpp and reports; a case's model side "
                   "runs in its worker process (kvpot.bench.process), which loads it",
}
# ... and by the module imported: heavy at import, or the root's lazy names
HEAVY = {
    "kvpot.api": "`import kvpot` stays cheap: kvpot/__init__.py imports the API when one of its names is first used",
    "kvpot.serve.app": "imports Starlette at its top",
}


@dataclass(frozen=True)
class Import:
    source: str   # the importing module
    target: str   # the module imported
    line: int
    lazy: bool    # inside a function


def module_files(root: Path = ROOT, dirs: dict[str, str] = PACKAGE_DIRS) -> dict[str, Path]:
    """Every module of the installed package, dotted name -> source file."""
    found = {}
    for folder in sorted(set(dirs.values())):
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_dotted(path, root, dirs)] = path
    return found


def _dotted(path: Path, root: Path, dirs: dict[str, str]) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    top = next(k for k, v in dirs.items() if v == parts[0])
    parts = top.split(".") + parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _spelled(name: str, dirs: dict[str, str]) -> str:
    """`cli.ask` (how a test or a tool might spell it) as kvpot.cli.ask; kvpot's own names unchanged."""
    head, _, rest = name.partition(".")
    for dotted, folder in dirs.items():
        if dotted != folder and head == folder:
            return dotted + ("." + rest if rest else "")
    return name


def imports_of(module: str, path: Path, known: set[str], dirs: dict[str, str] = PACKAGE_DIRS) -> list[Import]:
    """The imports of kvpot modules in one file, everywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(fn) if n is not fn)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_spelled(a.name, dirs) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = _spelled(node.module or "", dirs)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target in known and target != module:
                out.append(Import(module, target, node.lineno, id(node) in inside))
    return out


def import_graph(root: Path = ROOT, dirs: dict[str, str] = PACKAGE_DIRS) -> list[Import]:
    files = module_files(root, dirs)
    known = set(files)
    return [imp for mod, path in files.items() for imp in imports_of(mod, path, known, dirs)]


def folder(module: str) -> str:
    """kvpot.X of kvpot.X.Y...; the package root is its own folder."""
    return ".".join(module.split(".")[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node (Tarjan, without recursion)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    n = stack.pop()
                    on.discard(n)
                    part.append(n)
                    if n == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def _edges(imports: list[Import], level) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for imp in imports:
        a, b = level(imp.source), level(imp.target)
        if a != b:
            out.setdefault(a, set()).add(b)
    return out


def _explain(imports: list[Import], parts: list[list[str]], level) -> str:
    lines = []
    for part in parts:
        lines.append("cycle: " + " ".join(part))
        for imp in imports:
            a, b = level(imp.source), level(imp.target)
            if a != b and a in part and b in part:
                lines.append(f"  {imp.source}:{imp.line} imports {imp.target}{' (in a function)' if imp.lazy else ''}")
    return "\n".join(lines)


def upward(imports: list[Import], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Imports from a folder to one of its own layer or a layer above."""
    rank = {f: i for i, layer in enumerate(layers) for f in layer}
    bad = []
    for imp in imports:
        a, b = folder(imp.source), folder(imp.target)
        if a != b and rank[b] <= rank[a]:
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} ({a} is not above {b})")
    return bad


def undeclared_lazy(imports: list[Import]) -> list[str]:
    return [f"{imp.source}:{imp.line} imports {imp.target} inside a function" for imp in imports
            if imp.lazy and folder(imp.source) not in FRONT_ENDS and imp.target not in HEAVY]


GRAPH = import_graph()


def test_the_walk_finds_every_folder():
    modules = set(module_files())
    assert {"kvpot", "kvpot.cli.main", "kvpot.models.registry", "kvpot.converters.adapter",
            "kvpot.state.engine_state", "kvpot.engine"} <= modules
    assert len(GRAPH) > 500
    folders = {folder(m) for m in modules}
    layered = [f for layer in LAYERS for f in layer]
    assert len(layered) == len(set(layered)), "a folder is in two layers"
    assert folders == set(layered), f"not in LAYERS: {sorted(folders - set(layered))}; " \
                                    f"in LAYERS, not in the tree: {sorted(set(layered) - folders)}"


def test_no_module_imports_another_that_imports_it_back():
    parts = cycles(_edges(GRAPH, lambda m: m))
    assert not parts, _explain(GRAPH, parts, lambda m: m)


def test_no_folder_cycle():
    parts = cycles(_edges(GRAPH, folder))
    assert not parts, _explain(GRAPH, parts, folder)


def test_every_import_goes_down_the_layers():
    bad = upward(GRAPH)
    assert not bad, "\n".join(bad)


def test_models_and_converters_stand_on_the_base_alone():
    """models/ (model files, the registry, shipped adapters) imports nothing of kvpot's layers, and converters/
    (the adapters' format) only models/ besides: the plan, the policies and the session call down into them."""
    base = {f for layer in LAYERS[-2:] for f in layer}
    for top, allowed in (("kvpot.models", base), ("kvpot.converters", base | {"kvpot.models"})):
        bad = [f"{i.source}:{i.line} imports {i.target}" for i in GRAPH
               if folder(i.source) == top and folder(i.target) not in allowed | {top}]
        assert not bad, bad


def test_policies_are_handed_their_shipped_adapters():
    """A policy never looks up the adapter kvpot ships for a model: the engine and the checks before it loads
    find it in models/'s registry by the model file's hash and hand its path to the policy."""
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in GRAPH
           if folder(i.source) == "kvpot.policies" and folder(i.target) == "kvpot.models"]
    assert not bad, bad


def test_an_import_inside_a_function_says_why():
    bad = undeclared_lazy(GRAPH)
    assert not bad, "import at the top of the module, or declare the heavy module in HEAVY:\n" + "\n".join(bad)


def test_the_checks_fail_on_a_cycle_an_upward_import_and_a_hidden_import(tmp_path):
    """A package written for the test: kvpot/low.py imports kvpot/high.py inside a function, and high imports
    low at its top (a cycle the function hides at run time); `from kvpot import low` names the module."""
    (tmp_path / "kvpot").mkdir()
    (tmp_path / "kvpot" / "__init__.py").write_text("")
    (tmp_path / "kvpot" / "low.py").write_text("def f():\n    from kvpot.high import g\n    return g\n")
    (tmp_path / "kvpot" / "high.py").write_text("from kvpot import low\n\ndef g():\n    return low\n")
    graph = import_graph(tmp_path, {"kvpot": "kvpot"})
    assert {(i.source, i.target, i.lazy) for i in graph} == {("kvpot.low", "kvpot.high", True),
                                                             ("kvpot.high", "kvpot.low", False)}
    assert cycles(_edges(graph, lambda m: m)) == [["kvpot.high", "kvpot.low"]]
    assert cycles(_edges(graph, folder)) == [["kvpot.high", "kvpot.low"]]
    assert upward(graph, [("kvpot.high",), ("kvpot.low",)]) == \
        ["kvpot.low:2 imports kvpot.high (kvpot.low is not above kvpot.high)"]
    assert undeclared_lazy(graph) == ["kvpot.low:2 imports kvpot.high inside a function"]
    # a cycle through three nodes, and a self-contained one beside a clean chain
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


# run in a fresh interpreter: the packages kvpot imports that are not kvpot's are loaded first (found by a child
# that imports all of kvpot), then each folder's modules are imported, in order, in a forked child whose
# sys.modules holds none of kvpot, as a fresh process's would (one process per folder keeps it fast; the walk
# above already rules out the cycles a module imported first would meet)
_IMPORT_EACH = r"""
import importlib, json, os, sys, traceback
groups = json.loads(sys.argv[1])
ours = lambda m: m == "kvpot" or m.startswith("kvpot.")
assert not [m for m in sys.modules if ours(m)]
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    for name in [n for g in groups for n in g]:
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    theirs = sorted({m.partition(".")[0] for m in sys.modules if not ours(m)} - {"llama_cpp", "torch", "__main__"})
    os.write(w, json.dumps(theirs).encode())
    os._exit(0)
os.close(w)
with os.fdopen(r, "rb") as f:
    theirs = json.loads(f.read() or b"[]")
os.wait()
for m in theirs:
    try:
        importlib.import_module(m)
    except BaseException:
        pass
assert not [m for m in sys.modules if ours(m)]
failed, running = {}, {}
def reap():
    pid, status = os.wait()
    group, r = running.pop(pid)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    if status:
        failed[group[0]] = out or f"exit status {status}"
for group in groups:
    if len(running) >= max(2, os.cpu_count() or 1):
        reap()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        name = "?"
        try:
            for name in group:
                importlib.import_module(name)
            os._exit(0)
        except BaseException:
            os.write(w, (name + ": " + traceback.format_exc()[-1500:]).encode())
            os._exit(1)
    os.close(w)
    running[pid] = (group, r)
while running:
    reap()
print(json.dumps(failed))
"""


def test_every_module_imports_in_a_fresh_interpreter():
    groups: dict[str, list[str]] = {}
    for m in sorted(module_files()):
        if not m.endswith(".__main__"):  # an entry point runs when imported
            groups.setdefault(folder(m), []).append(m)
    run = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(list(groups.values()))],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = json.loads(run.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{m}:\n{tb}" for m, tb in failed.items())
