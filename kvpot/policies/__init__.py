"""Pot policies: which cells each (layer, KV head) keeps when the pot is over budget.

Every policy is a `Policy` (the core hooks) and declares the capabilities it has (`QuestionFirst`,
`Catalyst`, `LengthAware`, `GraphPieces`, `ExternalMemory`; kvpot.policies.base says why they are
apart); wrappers that change one thing about any policy are in kvpot.policies.wrappers. A new
method is its own file plus one line in `POLICIES` (or `register_policy(cls)` from outside kvpot).

`make_policy("snapkv:window=16,kernel=7")` builds one from a command-line spec. A parameter typed
`X | None` also takes "none"; IMDC's `pruner` takes a registry name and builds that policy with
its default parameters (`imdc:pruner=snapkv,m_max=1024,chunk=512,function=sqrt`).
"""

from __future__ import annotations

import dataclasses
import typing

from kvpot.errors import KvpotError
from kvpot.policies.base import (
    NO_TAPS,
    BudgetTooSmall,
    Catalyst,
    ExternalMemory,
    GraphPieces,
    LengthAware,
    Policy,
    PotView,
    QuestionFirst,
    TapRequest,
    Wrapping,
)
from kvpot.policies.edgeinfinite import EdgeInfinite
from kvpot.policies.full_attention import FullAttention
from kvpot.policies.h2o import H2O
from kvpot.policies.imdc import IMDC
from kvpot.policies.infinipot import InfiniPot
from kvpot.policies.infllm import InfLLM
from kvpot.policies.locret import Locret
from kvpot.policies.registry import POLICIES
from kvpot.policies.snapkv import SnapKV
from kvpot.policies.streaming_llm import StreamingLLM
from kvpot.policies.truncate import Truncate

POLICIES.update({cls.name: cls for cls in (FullAttention, Truncate, StreamingLLM, SnapKV, H2O, InfiniPot, IMDC,
                                           Locret, EdgeInfinite, InfLLM)})

__all__ = [
    "H2O",
    "IMDC",
    "NO_TAPS",
    "POLICIES",
    "BudgetTooSmall",
    "Catalyst",
    "EdgeInfinite",
    "ExternalMemory",
    "FullAttention",
    "GraphPieces",
    "InfLLM",
    "InfiniPot",
    "LengthAware",
    "Locret",
    "Policy",
    "PotView",
    "QuestionFirst",
    "SnapKV",
    "StreamingLLM",
    "TapRequest",
    "Truncate",
    "Wrapping",
    "build_policy",
    "make_policy",
    "policy_parameters",
    "register_policy",
]


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


def policy_parameters(cls: type) -> dict[str, type]:
    """The parameters a policy class takes, name -> type, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _convert(policy: str, key: str, raw: str, kind: type):
    if kind is Policy:  # a wrapper's inner policy (IMDC's pruner): a registry name, default parameters
        if raw.lower() not in POLICIES or raw.lower() == policy:
            known = ", ".join(n for n in POLICIES if n != policy)
            raise KvpotError(f"policy {policy}: {key} must name another policy ({known}), got {raw!r}")
        return make_policy(raw)
    options = typing.get_args(kind)
    if type(None) in options and len(options) == 2:  # X | None
        if raw.lower() == "none":
            return None
        kind = next(o for o in options if o is not type(None))
    try:
        if kind is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise KvpotError(f"policy {policy}: {key} must be {kind.__name__}, got {raw!r}") from None


def make_policy(spec: str) -> Policy:
    """Build a policy from "name" or "name:key=value,key=value" (e.g. "streaming:n_sink=8")."""
    name, _, args = spec.strip().partition(":")
    name = name.strip().lower()
    cls = POLICIES.get(name)
    if cls is None:
        raise KvpotError(f"unknown policy {name!r}; known policies: {', '.join(POLICIES)}")
    params = policy_parameters(cls)
    kwargs: dict[str, object] = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq or not key or not raw:
            raise KvpotError(f"policy {name}: expected key=value, got {item!r}")
        if key not in params:
            known = ", ".join(params) or "none"
            raise KvpotError(f"policy {name} has no parameter {key!r}; its parameters: {known}")
        if key in kwargs:
            raise KvpotError(f"policy {name}: parameter {key!r} given twice")
        kwargs[key] = _convert(name, key, raw, params[key])
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise KvpotError(f"policy {name} needs {', '.join(missing)} (e.g. {name}:{missing[0]}=...)")
    return cls(**kwargs)


def build_policy(spec: str, budget: int, chunk: int) -> Policy:
    """A policy from its spec, sized by the user's --budget and --chunk (`Policy.fit`): what the
    engine will run, built before the model loads so a spec or budget that cannot work is refused
    first. The engine fits the policy it is given; this is for checks made before that."""
    policy = make_policy(spec)
    policy.fit(budget, chunk)
    return policy
