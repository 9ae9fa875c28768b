"""Settings for `ask` and `chat`: built-in defaults < the model's registry defaults < the config
file in the kvpot home (`config.toml`: a [defaults] table and [models."NAME"] tables) < the
command line. Each layer sets only the keys it names.

Every value is checked by `setting_problem` wherever it comes from (the config file, the registry,
the command line, a saved context's header), so a value llama.cpp cannot take never reaches it."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

try:
    import tomllib  # novm
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (tomllib is tomli, taken into 3.11)
    import tomli as tomllib

from kvpot import paths
from kvpot.errors import KvpotError
from kvpot.models.registry import KNOWN
from kvpot.policies import Policy, QuestionFirst, make_policy
from kvpot.session.checks import MAX_CELLS, check_budget
from kvpot.session.prompting import PROMPT_CHOICES

AUTO = "auto"
MIN_CELLS = 16       # the smallest pot, and the fewest tokens read per step
MAX_THREADS = 512    # ggml's GGML_MAX_N_THREADS: a thread pool never holds more
ON_OFF_AUTO = ("auto", "on", "off")
LOCATOR_CHOICES = ("keys", "pot", "bm25", "mix")  # kvpot.session.locating
CHOICES = {"flash_attn": ON_OFF_AUTO, "question_before": ("on", "off"), "prompt": PROMPT_CHOICES,
           "locator": LOCATOR_CHOICES}
# settings added after contexts were first saved, with the value those older contexts were read with
SAVED_BEFORE = {"flash_attn": "off", "question_before": "off", "locator": "pot"}


# the command-line option that sets each key where it is not --KEY (llama.cpp's name where it has the same option)
OPTION_NAMES = {"max_tokens": "--n-predict", "prompt": "--prompt-format"}


def option_name(key: str) -> str:
    """How a user sets `key` on the command line."""
    return OPTION_NAMES.get(key, "--" + key.replace("_", "-"))


@dataclass(frozen=True)
class RunSettings:
    policy: str = "infinipot"   # a policy spec; sizes it leaves open follow the budget (Policy.fit)
    budget: int | str = "auto"  # cells the memory may hold (InfiniPot's pot |M|; what others keep), or
                                # "auto": sized from the device (kvpot.session.auto_budget; cli/ask.py resolves it)
    chunk: int = 512            # tokens per step
    threads: int = 0            # 0: every core
    prompt: str = "auto"        # auto | chat | completion
    max_tokens: int = 256       # longest answer
    flash_attn: str = "auto"    # auto | on | off (llama.cpp's -fa): on holds no chunk x cells score matrix, so
                                # the same memory holds 2-5x the cells, but reads large contexts slower on a CPU;
                                # auto: on only where the device cannot hold the model's window (or a --budget N pot) without it
                                # (reading_plan.resolve_flash_attn, before the session starts)
    question_before: str = "off"  # on | off: a question known before reading (`ask`) also goes before the document,
                                # so the document is read knowing what is asked (Liu et al. 2023, "Lost in the
                                # Middle", query-aware contextualization); off by default, as measured on the 1.5B
                                # model's 8K multi-key cases (docs/benchmarks.md, "The question before the document")
    locator: str = "bm25"       # how a question asked after a read past the pot finds its passages again
                                # (kvpot.session.locating): keys | pot | bm25 | mix; bm25 by measurement
                                # (docs/benchmarks.md, "Finding a question's passages after one read")

    def check(self, names: dict[str, str] | None = None) -> RunSettings:
        """`names`: how the user spelled each key (e.g. "--n-predict", or "max_tokens in config.toml")."""
        return self.check_with_policy(names)[0]

    def check_with_policy(self, names: dict[str, str] | None = None) -> tuple[RunSettings, Policy]:
        """`check`, with the policy the settings name, built once for the session to run it: parsed
        from the spec (a bad one named where it was set) and, when the budget is a number, fitted to
        it, so a budget the policy can never work with is said now, not at its first compaction.
        Full attention is left unfitted: the reading plan sizes its context from the input."""
        n = lambda key: (names or {}).get(key, option_name(key))  # noqa: E731
        policy = None
        for key in KEYS:
            if key == "policy":
                policy, problem = parse_policy(self.policy)
            else:
                problem = setting_problem(key, getattr(self, key))
            if problem:
                raise KvpotError(f"{n(key)} {problem}")
        if self.budget != AUTO and not reads_in_full(self.policy):
            check_budget(policy, self.budget, self.chunk, n("budget"))
        return replace(self, threads=self.threads or default_threads()), policy


def reads_in_full(policy_spec: str) -> bool:
    """The spec names full attention (`--policy full`), whose context the input sets, not a pot."""
    return policy_spec.strip().partition(":")[0].strip().lower() == "full"


def reads_with_question(policy: Policy) -> bool:
    """What the policy keeps depends on the question when it is known before reading (InfiniPot's CaP-Q,
    kvpot.policies.QuestionFirst): a read before any question (`kvpot chat`) keeps what no question chose."""
    return QuestionFirst.held_by(policy)


def default_threads() -> int:
    """Threads when none are asked for: every core (llama.cpp's own default is the same)."""
    return max(1, os.cpu_count() or 1)


KEYS = tuple(f.name for f in fields(RunSettings))
_INTS = {"budget", "chunk", "threads", "max_tokens"}


def describe(value) -> str:
    """A value as a TOML or JSON reader handed it over, for an error line."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, (int, float, str)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a {type(value).__name__}"


def setting_problem(key: str, value) -> str | None:
    """What is wrong with one setting's value, as the rest of a sentence that starts with its name
    (None: nothing). Integers are bounded by what llama.cpp addresses (ctypes would wrap larger ones)."""
    if key == "budget" and value == AUTO:
        return None
    if key in _INTS and (not isinstance(value, int) or isinstance(value, bool)):
        return f"must be {'a number of cells or ' + repr(AUTO) if key == 'budget' else 'an integer'}, got {describe(value)}"
    if key not in _INTS and not isinstance(value, str):
        return f"must be a string, got {describe(value)}"
    if key == "budget" and value < MIN_CELLS:
        return f"{value} is too small: the pot needs at least {MIN_CELLS} cells"
    if key == "chunk" and value < MIN_CELLS:
        return f"{value} is too small: read at least {MIN_CELLS} tokens per step"
    if key == "max_tokens" and value < 1:
        return f"must be at least 1, got {value}"
    if key == "threads" and not 0 <= value <= MAX_THREADS:
        return f"must be 1 to {MAX_THREADS} (0: every core), got {value}"
    if key in ("budget", "chunk", "max_tokens") and value > MAX_CELLS:
        return f"{value:,} is larger than llama.cpp can address ({MAX_CELLS:,} cells)"
    if key in CHOICES and value not in CHOICES[key]:
        return f"must be one of {', '.join(CHOICES[key])}, got {describe(value)}"
    if key == "policy":
        # a spec is checked by building it (each policy checks its parameters as it is made) and the
        # object dropped: a stored value (the config file's tables, a saved context's header) is checked
        # where it was set, before any budget is known; the session's own policy is built once from the
        # merged settings (RunSettings.check_with_policy)
        return parse_policy(value)[1]
    return None


def parse_policy(value) -> tuple[Policy | None, str | None]:
    """The policy a spec names, or what is wrong with it (as `setting_problem` words it)."""
    if not isinstance(value, str):
        return None, f"must be a string, got {describe(value)}"
    try:
        return make_policy(value), None
    except KvpotError as e:
        return None, f"{describe(value)} is not a policy spec kvpot can run: {e}"


def config_path() -> Path:
    return paths.home() / "config.toml"


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close:
        close = [k for k in known if k.lower() == name.lower()]
    return f"did you mean {close[0]!r}? " if close else ""


def _check_table(table, where: str) -> dict:
    """One table of settings ([defaults], [models."NAME"]): known keys, each value's type and range."""
    if not isinstance(table, dict):
        raise KvpotError(f"{where} must be a table of settings, got {describe(table)}")
    for key, value in table.items():
        if key not in KEYS:
            raise KvpotError(f"{where}: unknown setting {key!r} ({_suggest(key, KEYS)}known: {', '.join(KEYS)})")
        problem = setting_problem(key, value)
        if problem:
            raise KvpotError(f"{where}: {key} {problem}")
    return table


def check_config(cfg: dict, path: Path) -> dict:
    """The whole file's structure: only [defaults] and [models."NAME"] for known models, then every value."""
    for key in cfg:
        if key not in ("defaults", "models"):
            raise KvpotError(f"config file {path}: unknown table or key {key!r} "
                             f"({_suggest(key, ('defaults', 'models'))}allowed: [defaults] and [models.\"NAME\"])")
    _check_table(cfg.get("defaults", {}), f"config file {path}: [defaults]")
    models = cfg.get("models", {})
    if not isinstance(models, dict):
        raise KvpotError(f"config file {path}: models must hold [models.\"NAME\"] tables, got {describe(models)}")
    for name, table in models.items():
        if name not in KNOWN:
            raise KvpotError(f"config file {path}: [models.{name!r}] is not a known model "
                             f"({_suggest(name, KNOWN)}known: {', '.join(KNOWN)})")
        _check_table(table, f"config file {path}: [models.\"{name}\"]")
    return cfg


def load_config(path: Path | None = None) -> dict:
    """The config file, checked whole (a file that is not there is an empty config)."""
    path = path or config_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise KvpotError(f"config file {path} is a directory") from None
    except OSError as e:
        raise KvpotError(f"cannot read config file {path}: {e.strerror or e}") from None
    return parse_config(data, path)


def parse_config(data: bytes, path: Path | str) -> dict:
    """The bytes of a config file, parsed and checked (the part the fuzzer drives)."""
    try:
        cfg = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KvpotError(f"config file {path} is not valid TOML: it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise KvpotError(f"config file {path} is not valid TOML: {_one_line(e)}") from None
    return check_config(cfg, path)


def _one_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]


def set_in_config(key: str, model_name: str | None, path: Path | None = None) -> bool:
    """Whether the config file sets `key` ([defaults], or the model's own table): the user's choice, as
    an option on the command line is (a policy named there is honoured, not replaced by full attention
    where the input fits)."""
    cfg = load_config(path or config_path())
    tables = [cfg.get("defaults", {})]
    if model_name:
        tables.append(cfg.get("models", {}).get(model_name, {}))
    return any(key in table for table in tables)


def resolve_settings(model_name: str | None, registry_defaults: dict, cli: dict, path: Path | None = None) -> RunSettings:
    """Merge the layers; `cli` holds only the options the user gave (None values are ignored)."""
    return resolve_settings_and_policy(model_name, registry_defaults, cli, path)[0]


def resolve_settings_and_policy(model_name: str | None, registry_defaults: dict, cli: dict,
                                path: Path | None = None) -> tuple[RunSettings, Policy]:
    """`resolve_settings`, with the policy they name, built once for the session to run
    (RunSettings.check_with_policy)."""
    path = path or config_path()
    settings, names = _merge(load_config(path), path, model_name, registry_defaults, cli)
    return settings.check_with_policy(names)


def merge_settings(cfg: dict, path: Path | str, model_name: str | None, registry_defaults: dict,
                   cli: dict) -> RunSettings:
    """The layers over a checked config (load_config), checked together (a budget the policy cannot use)."""
    settings, names = _merge(cfg, path, model_name, registry_defaults, cli)
    return settings.check(names)


def _merge(cfg: dict, path: Path | str, model_name: str | None, registry_defaults: dict,
           cli: dict) -> tuple[RunSettings, dict[str, str]]:
    """The layers merged, unchecked, with where each key was set (to name it in an error)."""
    merged: dict = {}
    names: dict[str, str] = {}
    layers = [({k: v for k, v in registry_defaults.items() if k in KEYS}, "in the model registry"),
              (cfg.get("defaults", {}), f"in {path} [defaults]")]
    if model_name:
        layers.append((cfg.get("models", {}).get(model_name, {}), f"in {path} [models.\"{model_name}\"]"))
    for values, origin in layers:
        merged.update(values)
        names.update({k: f"{k} {origin}" for k in values})
    given = {k: v for k, v in cli.items() if v is not None}
    merged.update(given)
    names.update({k: option_name(k) for k in given})
    return RunSettings(**merged), names
