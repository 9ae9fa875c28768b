"""The policies `make_policy` builds, by name: a module below every policy, so a policy that names others (IMDC's
pruner, which must be one of them) reads the table without importing the package that fills it
(kvpot/policies/__init__.py registers the built-in ones)."""

from __future__ import annotations

from kvpot.errors import KvpotError
from kvpot.policies.base import Policy

# name -> class; read as registry.POLICIES where it is used, so a test that swaps in a copy (monkeypatch) swaps it
# for every reader
POLICIES: dict[str, type] = {}


def register_policy(cls: type) -> type:
    """Add a policy class to the registry under its `name`, so `make_policy` (and every `--policy`)
    builds it from a spec; usable as a decorator. A name another class holds is refused, as is one
    a spec could not spell (lowercase letters, digits and _ only)."""
    name = getattr(cls, "name", "")
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise KvpotError(f"register_policy takes a Policy subclass, got {cls!r}")
    if not isinstance(name, str) or not name or not all(c.islower() or c.isdigit() or c == "_" for c in name):
        raise KvpotError(f"policy name {name!r} must be lowercase letters, digits and _")
    if POLICIES.get(name, cls) is not cls:
        raise KvpotError(f"policy name {name!r} is taken by {POLICIES[name].__name__}")
    POLICIES[name] = cls
    return cls
