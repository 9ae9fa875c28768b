"""Imports between the adapter types and the policies go one way: kvpot.policies may import
kvpot.converters (the adapter types live in kvpot.converters.adapter), and no module of
kvpot.converters imports anything of kvpot.policies, directly, inside a function, or through the
kvpot modules it imports. Every module of both packages imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpot.converters
import kvpot.policies

POLICIES = "kvpot.policies"


def _modules(package) -> list[str]:
    return sorted(f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__))


CONVERTERS = _modules(kvpot.converters)
POLICY_MODULES = _modules(kvpot.policies)


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is a plain module: `name` is an attribute of it
        return False


def _imports(module: str) -> set[str]:
    """Every kvpot module `module` imports, anywhere in its file (functions included), as written in
    its import statements: `from a import b` names a.b where that is a module, else a. A module-level
    `__getattr__` (PEP 562: kvpot/__init__.py's lazy API names) is left out: it runs when its attribute is
    asked for, which importing a module never does."""
    path = _source(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
    return {name for name in found if name == "kvpot" or name.startswith("kvpot.")}


def _with_parents(name: str) -> set[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _reached(module: str) -> dict[str, str]:
    """Every kvpot module importing `module` can run, each with the module that imports it."""
    seen = {mod: "" for mod in _with_parents(module)}
    todo = list(seen)
    while todo:
        here = todo.pop()
        for name in _imports(here):
            for mod in _with_parents(name):
                if mod not in seen and _is_module(mod):
                    seen[mod] = here
                    todo.append(mod)
    return seen


def test_the_packages_are_found():
    # the lists the parametrized checks run over are not empty, and hold the two modules this is about
    assert "kvpot.converters.adapter" in CONVERTERS
    assert {"kvpot.policies.edgeinfinite", "kvpot.policies.locret"} <= set(POLICY_MODULES)


@pytest.mark.parametrize("module", CONVERTERS)
def test_converters_import_no_policy(module):
    reached = _reached(module)
    policies = sorted(m for m in reached if m == POLICIES or m.startswith(POLICIES + "."))
    chains = []
    for m in policies:
        chain = [m]
        while reached[chain[-1]]:
            chain.append(reached[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not chains, f"{module} reaches kvpot.policies: {chains}"


@pytest.mark.parametrize("module", ["kvpot.policies.edgeinfinite", "kvpot.policies.locret"])
def test_policies_take_the_adapter_types_from_the_adapter_module(module):
    assert "kvpot.converters.adapter" in _imports(module)


@pytest.mark.parametrize("module", CONVERTERS + POLICY_MODULES)
def test_module_imports_alone(module):
    """Imported first, in a fresh interpreter: an import cycle shows as an ImportError of a partly
    initialised module. The modules loaded are reported back, so a converter that pulls a policy in at
    run time (past what the source check reads) fails too."""
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvpot'))))")
    run = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert module in loaded
    if module.startswith("kvpot.converters."):
        assert not [m for m in loaded if m == POLICIES or m.startswith(POLICIES + ".")], loaded
