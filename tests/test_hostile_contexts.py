"""Saved contexts with a right checksum but crafted fields (the checksum recomputed after each edit):
every header field, the engine's bookkeeping, its arrays and kvpot's C state are checked before any of
it is used, so each is refused with one KvpotError line and nothing reaches llama.cpp (which would
print its own internals)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.bench.logbook import logbook
from kvpot.engine import _SAVED_SCALARS
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.checks import MAX_CELLS
from kvpot.session.context_file import SavedContext, read_context, write_context
from kvpot.session.session import Session
from kvpot.session.settings import RunSettings
from kvpot.state.engine_state import ENGINE_OPTIONAL, ENGINE_SCALARS
from kvpot.state.recall_cells import RecallCells

SMALL = RunSettings(policy="h2o", budget=64, chunk=32, threads=2, prompt="completion", max_tokens=2)


@pytest.fixture(scope="module")
def saved(smollm2_path, tmp_path_factory):
    """A context kvpot saved (H2O: its state holds an array), read back."""
    folder = tmp_path_factory.mktemp("ctx")
    doc = folder / "doc.txt"
    doc.write_text(logbook()[0][:1200])
    with Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check()) as s:
        s.read(collect_sources([str(doc)]))
        assert s.engine.n_compactions > 0
        s.save(folder / "good.kvctx")
    return read_context(folder / "good.kvctx")


def _edit_pot(saved: SavedContext, word: int, value: int) -> None:
    words = np.frombuffer(saved.state.pot, dtype="<i4").copy()
    words[word] = value
    saved.state.pot = words.tobytes()


def _set(part: str, key: str, value):
    def edit(c: SavedContext) -> None:
        target = c.header if part == "header" else c.state.values
        for k in key.split(".")[:-1]:
            target = target[k]
        target[key.split(".")[-1]] = value
    return edit


def _del(part: str, key: str):
    def edit(c: SavedContext) -> None:
        (c.header if part == "header" else c.state.values).pop(key)
    return edit


def _array(name: str, make):
    def edit(c: SavedContext) -> None:
        if make is None:
            del c.state.arrays[name]
        else:
            c.state.arrays[name] = make(c.state.arrays[name], c)
    return edit


CASES = {
    "settings.budget abc": (_set("header", "settings.budget", "abc"), "settings.budget must be a number of cells"),
    "settings.budget 10**12": (_set("header", "settings.budget", 10**12), "larger than llama.cpp can address"),
    "settings.budget auto": (_set("header", "settings.budget", "auto"), "unresolved budget"),
    "settings.chunk -1": (_set("header", "settings.chunk", -1), "settings.chunk -1 is too small"),
    "settings.threads 10**6": (_set("header", "settings.threads", 10**6), "settings.threads must be 1 to"),
    "settings.prompt 3": (_set("header", "settings.prompt", 3), "settings.prompt must be a string"),
    "settings.max_tokens 0": (_set("header", "settings.max_tokens", 0), "settings.max_tokens must be at least 1"),
    "settings extra key": (_set("header", "settings.temperature", 1), "header field settings has keys"),
    "settings not an object": (_set("header", "settings", [1]), "settings is not a dict"),
    "policy unknown": (lambda c: (_set("header", "policy", "nosuch")(c), _set("header", "settings.policy", "nosuch")(c)),
                       "settings.policy 'nosuch' is not a policy spec kvpot can run: unknown policy"),
    "policy not its settings'": (_set("header", "policy", "snapkv"), "is not the one its settings name"),
    "n_ctx 0": (_set("header", "n_ctx", 0), "n_ctx 0 is outside"),
    "n_ctx 2**40": (_set("header", "n_ctx", 2**40), f"outside 1..{MAX_CELLS}"),
    "n_ctx float": (_set("header", "n_ctx", 512.0), "n_ctx is not an int"),
    "tokens_read -1": (_set("header", "tokens_read", -1), "tokens_read -1 is outside"),
    "tokens_read past tokens_seen": (lambda c: c.header.update(tokens_read=c.state.values["tokens_seen"] + 1),
                                     "more than the engine's tokens_seen"),
    "turns 2**40": (_set("header", "turns", 2**40), "turns 1099511627776 is outside"),
    "turns bool": (_set("header", "turns", True), "turns is not an int"),
    "sources name": (_set("header", "sources", [{"name": 3}]), "has no name"),
    "sources size": (_set("header", "sources", [{"name": "a", "size": -1}]), "has size -1"),
    "prompt_format": (_set("header", "prompt_format", "jinja"), "prompt_format must be one of"),
    "format": (_set("header", "format", "other"), "header field format is 'other'"),
    "model sha256": (_set("header", "model.sha256", "zz"), "no sha256 digest"),
    "runtime abi str": (_set("header", "runtime.abi", "4"), "runtime.abi is not an int"),
    "pos_next 10**12": (_set("engine", "pos_next", 10**12), "engine.pos_next is 1000000000000, outside 0..2147483647"),
    "pos_next -1": (_set("engine", "pos_next", -1), "engine.pos_next is -1"),
    "pos_next str": (_set("engine", "pos_next", "5"), "engine.pos_next is not an integer"),
    "pos_next float": (_set("engine", "pos_next", 5.5), "engine.pos_next is not an integer"),
    "tokens_seen bool": (_set("engine", "tokens_seen", True), "engine.tokens_seen is not an integer"),
    "_bos_done str": (_set("engine", "_bos_done", "yes"), "engine._bos_done is not true or false"),
    "step 2**40": (_set("engine", "step", 2**40), "engine.step is 1099511627776"),
    "compact_seconds nan": (_set("engine", "compact_seconds", math.nan), "engine.compact_seconds is not finite"),
    "n_compactions -1": (_set("engine", "n_compactions", -1), "engine.n_compactions is -1"),
    "_fetch_n past n_ctx": (lambda c: c.state.values.update(_fetch_n=c.header["n_ctx"], _fetch_bs=2),
                            "recalled blocks run past"),
    "_mem_cell0 past n_ctx": (lambda c: c.state.values.update(_mem_cell0=c.header["n_ctx"], _mem_n=1),
                              "memory cells run past"),
    "_mem_distance 2**40": (_set("engine", "_mem_distance", 2**40), "engine._mem_distance is 1099511627776"),
    "engine field missing": (_del("engine", "pos_next"), "engine state has no pos_next"),
    "engine field unknown": (_set("engine", "extra", 1), "unknown fields ['extra']"),
    "policy state not an object": (_set("engine", "policy", 5), "policy state is not an object"),
    "policy state unknown field": (_set("engine", "policy._zzz", 1), "unknown field '_zzz'"),
    "policy state wrong type": (_set("engine", "policy._acc", "x"), "policy._acc is not a"),
    "policy state parameter": (_set("engine", "policy.heavy_ratio", 5), "policy.heavy_ratio is not the state of a wrapped"),
    "policy state unknown array": (_set("engine", "policy._acc", {"__array__": "nope"}), "does not hold: nope"),
    "policy state bad tuple": (_set("engine", "policy._acc", {"__tuple__": 5}), "malformed tuple"),
    "policy array of text": (_array("policy._acc", lambda a, c: np.array(["x"] * 3)), "policy._acc is not a"),
    "positions missing": (_array("positions", None), "array 'positions' is missing"),
    "positions float": (_array("positions", lambda a, c: a.astype(np.float32)), "not int64 [layers, heads, cells]"),
    "positions 2-d": (_array("positions", lambda a, c: a[0]), "not int64 [layers, heads, cells]"),
    "positions past n_ctx": (_array("positions", lambda a, c: np.zeros((*a.shape[:2], c.header["n_ctx"] + 1), a.dtype)),
                             "not [layers, KV heads, at most"),
    "positions past tokens_seen": (_array("positions", lambda a, c: a + c.state.values["tokens_seen"]),
                                   "outside the"),
    "positions negative": (_array("positions", lambda a, c: a - a.max() - 1), "outside the"),
    "memory not uint8": (lambda c: c.state.arrays.update(memory=np.zeros((2, 2), np.float32)), "array 'memory'"),
    "pot truncated": (lambda c: setattr(c.state, "pot", c.state.pot[:-4]), "kvpot state has"),
    "pot magic": (lambda c: _edit_pot(c, 0, 0), "another magic or version"),
    "pot layers": (lambda c: _edit_pot(c, 2, 29), "kvpot state is for 29 x 3"),
    "pot compacted cells": (lambda c: _edit_pot(c, 4, 10**6), "compacted cells of"),
    "pot budget": (lambda c: _edit_pot(c, 5, -1), "negative budget"),
    "pot rope position": (lambda c: _edit_pot(c, 7, 2**31 - 1), "RoPE positions outside"),
    "pot live cells": (lambda c: _edit_pot(c, -1, 10**6), "a layer holds more or fewer"),
}


def _crafted(saved: SavedContext, edit, path):
    c = SavedContext(header=copy.deepcopy(saved.header), state=copy.deepcopy(saved.state))
    edit(c)
    write_context(path, c)  # the checksum is recomputed: only the checks behind it can refuse
    return path


@pytest.mark.parametrize("edit, needle", CASES.values(), ids=list(CASES))
def test_crafted_field_is_one_line_before_any_c(saved, smollm2_path, tmp_path, capfd, edit, needle):
    path = _crafted(saved, edit, tmp_path / "c.kvctx")
    with pytest.raises(KvpotError) as e:
        Session.reopen(path, read_model_facts(smollm2_path), "smollm2-135m")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"saved context {path} is malformed: ") and needle in msg, msg
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # llama.cpp never ran


def test_the_unedited_context_reopens(saved, smollm2_path, tmp_path):
    """The checks refuse what each case changes, not the context kvpot saved."""
    path = _crafted(saved, lambda c: None, tmp_path / "c.kvctx")
    with Session.reopen(path, read_model_facts(smollm2_path), "smollm2-135m") as r:
        assert r.engine.pos_next == saved.state.values["pos_next"]


def test_next_position_that_does_not_follow_the_cache_is_refused(saved, smollm2_path, tmp_path, capfd):
    """A position in range but not the one after the restored cache: llama.cpp would refuse it at the next
    decode with its internals on stderr; the session refuses it right after restoring, in one line."""
    path = _crafted(saved, _set("engine", "pos_next", saved.state.values["pos_next"] + 5), tmp_path / "c.kvctx")
    with pytest.raises(KvpotError, match="does not follow the restored cache"):
        Session.reopen(path, read_model_facts(smollm2_path), "smollm2-135m")
    assert capfd.readouterr().err == ""


def test_cli_pos_next_overflow_is_one_line(saved, tmp_path):
    path = _crafted(saved, _set("engine", "pos_next", 10**12), tmp_path / "c.kvctx")
    res = run_cli("ask", "--context", str(path), "what?")
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "engine.pos_next is 1000000000000")


def test_schema_names_what_the_engine_saves():
    """The check knows every field the engine writes (and no other)."""
    assert set(ENGINE_SCALARS) == set(_SAVED_SCALARS)
    assert set(ENGINE_OPTIONAL) == set(RecallCells(None, None).export())
