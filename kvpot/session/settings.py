"""Settings for `ask` and `chat`: built-in defaults < the model's registry defaults < the config
file in the kvpot home (`config.toml`: a [defaults] table and [models."NAME"] tables) < the
command line. Each layer sets only the keys it names."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import tomllib

from kvpot import paths
from kvpot.errors import KvpotError
from kvpot.session.prompting import PROMPT_CHOICES


@dataclass(frozen=True)
class RunSettings:
    policy: str = "infinipot"   # a policy spec; sizes it leaves open follow the budget (Policy.fit)
    budget: int | str = "auto"  # cells the memory may hold (InfiniPot's pot |M|; what others keep), or
                                # "auto": sized from the device (kvpot.session.auto_budget; cli/ask.py resolves it)
    chunk: int = 512            # tokens per step
    threads: int = 0            # 0: every core
    prompt: str = "auto"        # auto | chat | completion
    max_tokens: int = 256       # longest answer

    def check(self, names: dict[str, str] | None = None) -> RunSettings:
        """`names`: how the user spelled each key (e.g. "--max-tokens", or "max_tokens in config.toml")."""
        n = lambda key: (names or {}).get(key, "--" + key.replace("_", "-"))  # noqa: E731
        if isinstance(self.budget, str) and self.budget != AUTO:
            raise KvpotError(f"{n('budget')} must be a number of cells or {AUTO!r}, got {self.budget!r}")
        if self.budget != AUTO and self.budget < 16:
            raise KvpotError(f"{n('budget')} {self.budget} is too small: the pot needs at least 16 cells")
        if self.chunk < 16:
            raise KvpotError(f"{n('chunk')} {self.chunk} is too small: read at least 16 tokens per step")
        if self.prompt not in PROMPT_CHOICES:
            raise KvpotError(f"{n('prompt')} must be one of {', '.join(PROMPT_CHOICES)}, got {self.prompt!r}")
        if self.max_tokens < 1:
            raise KvpotError(f"{n('max_tokens')} must be at least 1, got {self.max_tokens}")
        if self.threads < 0:
            raise KvpotError(f"{n('threads')} must be at least 1 (0: every core), got {self.threads}")
        if self.budget != AUTO:  # a budget the policy can never work with: said now, not at its first compaction
            from kvpot.session.checks import check_budget

            check_budget(self.policy, self.budget, self.chunk, n("budget"))
        return replace(self, threads=self.threads or default_threads())


AUTO = "auto"


def default_threads() -> int:
    """Threads when none are asked for: every core (llama.cpp's own default is the same)."""
    return max(1, os.cpu_count() or 1)
KEYS = {f.name: f.type for f in fields(RunSettings)}


def config_path() -> Path:
    return paths.home() / "config.toml"


def _layer(table: dict, where: str) -> dict:
    out = {}
    for key, value in table.items():
        if key not in KEYS:
            raise KvpotError(f"{where}: unknown setting {key!r} (known: {', '.join(KEYS)})")
        want = int if KEYS[key].startswith("int") else str
        if key == "budget" and value == AUTO:
            pass
        elif not isinstance(value, want) or isinstance(value, bool):
            what = "n integer" + (f" or {AUTO!r}" if key == "budget" else "") if want is int else " string"
            raise KvpotError(f"{where}: {key} must be a{what}, got {value!r}")
        out[key] = value
    return out


def load_config(path: Path | None = None) -> dict:
    path = path or config_path()
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise KvpotError(f"config file {path} is not valid TOML: {e}") from None


def resolve_settings(model_name: str | None, registry_defaults: dict, cli: dict, path: Path | None = None) -> RunSettings:
    """Merge the layers; `cli` holds only the options the user gave (None values are ignored)."""
    cfg = load_config(path)
    where = str(path or config_path())
    merged: dict = {}
    names: dict[str, str] = {}  # where each key was set, to name it in an error
    layers = [(_layer({k: v for k, v in registry_defaults.items() if k in KEYS}, "model registry"), "in the model registry"),
              (_layer(cfg.get("defaults", {}), f"{where} [defaults]"), f"in {where} [defaults]")]
    if model_name:
        layers.append((_layer(cfg.get("models", {}).get(model_name, {}), f"{where} [models.{model_name}]"),
                       f"in {where} [models.{model_name}]"))
    for values, origin in layers:
        merged.update(values)
        names.update({k: f"{k} {origin}" for k in values})
    given = {k: v for k, v in cli.items() if v is not None}
    merged.update(given)
    names.update({k: "--" + k.replace("_", "-") for k in given})
    return RunSettings(**merged).check(names)
