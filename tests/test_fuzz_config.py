"""Property-based fuzzing (Hypothesis) of config.toml (kvpot/session/settings.py): the checks of the whole
file, then the layers merged and checked as `ask` checks them.

Property (tests/fuzzlib.py): every input is either accepted or refused with one KvpotError line.
Inputs: files of valid structure ([defaults], [models."NAME"]) whose keys, value types and values are
fuzzed; the same files' bytes mutated (flips, cuts, insertions); and raw text.
"""

from __future__ import annotations

import json

from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.models.registry import KNOWN
from kvpot.session.settings import KEYS, merge_settings, parse_config


def teardown_module(module) -> None:
    write_report()


_PATH = "fuzzed/config.toml"
_INT = st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from((0, 1, 15, 16, 17, 511, 512, 513, 2**30, 2**30 + 1,
                                                                  2**31, -1)))
_STR = st.one_of(st.text(max_size=12), st.sampled_from(("auto", "chat", "completion", "infinipot", "streaming:n_sink=4",
                                                        "snapkv:window=8", "imdc:pruner=snapkv", "h2o", "nosuch",
                                                        "infinipot:pot=64,keep=32", "streaming:n_sink=x", "infllm")))
_SCALAR = st.one_of(_INT, _STR, st.booleans(), st.floats(allow_nan=True, allow_infinity=True))
_VALUE = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(st.sampled_from(KEYS), _SCALAR, max_size=2))
_KEY = st.one_of(st.sampled_from(KEYS * 3), st.text(max_size=8))
_TABLE = st.dictionaries(_KEY, _VALUE, max_size=4)
_MODEL = st.one_of(st.sampled_from(tuple(KNOWN) * 3), st.text(max_size=10), st.sampled_from(("smollm2-135M", "gemma")))
_TOP = st.fixed_dictionaries({"defaults": st.one_of(_TABLE, _SCALAR), "models": st.one_of(
    st.dictionaries(_MODEL, st.one_of(_TABLE, _SCALAR), max_size=3), _SCALAR)},
    optional={"extra": _VALUE})
_DROP = st.sampled_from((None, "defaults", "models"))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string, escapes included
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(cfg: dict) -> str:
    """A small TOML writer for what the strategies draw (tomllib reads, it does not write)."""
    lines = []
    for key, value in cfg.items():
        if isinstance(value, dict) and key == "models":
            for name, table in value.items():
                if isinstance(table, dict):
                    lines.append(f"[models.{json.dumps(name)}]")
                    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
                else:
                    lines += ["[models]", f"{json.dumps(name)} = {_toml_value(table)}"]
        elif isinstance(value, dict):
            lines.append(f"[{json.dumps(key)}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()]
        else:
            lines.insert(0, f"{json.dumps(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _load(data: bytes) -> None:
    """The config loader and, when it accepts the file, the settings `ask` would use for each model."""
    cfg = parse_config(data, _PATH)
    for model in (None, *KNOWN):
        merge_settings(cfg, _PATH, model, {}, {})


@st.composite
def _config_strategy(draw) -> bytes:
    cfg = draw(_TOP)
    drop = draw(_DROP)
    if drop:
        cfg.pop(drop)
    return to_toml(cfg).encode()


_config = _config_strategy()
_MUTATED = st.tuples(_config, MUTATIONS)


@FUZZ
@given(batch(_config))
def test_fuzz_config_structured(batch):
    for data in batch:
        check("config.toml, structured", _load, data)


@FUZZ
@given(batch(_MUTATED))
def test_fuzz_config_mutated(batch):
    for data, plan in batch:
        check("config.toml, structured and mutated", _load, mutate(data, plan))


@FUZZ
@given(batch(st.one_of(st.binary(max_size=128), st.text(max_size=64).map(str.encode))))
def test_fuzz_config_raw(batch):
    for data in batch:
        check("config.toml, raw text", _load, data)


def test_writer_round_trips_and_a_good_file_is_accepted():
    """The strategies reach the checks behind the parser: their writer's files parse back as drawn."""
    import tomllib

    cfg = {"defaults": {"chunk": 64, "prompt": "chat"}, "models": {name: {"budget": 128} for name in KNOWN}}
    assert tomllib.loads(to_toml(cfg)) == cfg
    _load(to_toml(cfg).encode())
