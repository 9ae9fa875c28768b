"""Saved contexts: the compressed memory of a read document, reopened without reading it again.

The file is kvpot.state.state_container's (docs/formats.md); this module holds what its header must say
for a saved context (model, runtime, policy, settings, sources, session) and checks all of it before any
of the state reaches the engine or C code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvpot.errors import KvpotError
from kvpot.locator.sources import SourceMap
from kvpot.policies import make_policy
from kvpot.session.checks import MAX_CELLS
from kvpot.session.settings import KEYS, SAVED_BEFORE, describe, setting_problem
from kvpot.state.engine_state import (
    INT32_MAX,
    INT64_MAX,
    EngineState,
    check_engine_values,
    check_policy_state,
    check_pot_bytes,
)
from kvpot.state.read_point import ReadPoint, ReadStopped
from kvpot.state.state_container import one_line, parse_state, read_state, write_state

WHAT = "saved context"
FORMAT_NAME = "kvpot saved context"   # the header's "format"


@dataclass
class SavedContext:
    header: dict          # model, runtime, policy, settings, sources, session (see docs/formats.md)
    state: EngineState


def write_context(path: Path, saved: SavedContext) -> int:
    """Write atomically; returns the file size."""
    return write_state(path, saved.header, saved.state, "context")


# header fields later code reads, with their JSON types: a file with the right checksum but
# another shape (a bug, a hand edit, a fuzzer) is refused here rather than as a KeyError later
_HEADER_SCHEMA = {
    "runtime": {"abi": int, "llama_commit": str},
    "model": {"name": str, "path": str, "sha256": str},
    "policy": str,
    "settings": dict,
    "n_ctx": int,
    "tokens_read": int,
    "sources": list,
    "turns": int,
    "engine": dict,
}


def _check_shape(value, schema, where: str) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where or 'header'} is not an object")
        for key, sub in schema.items():
            if key not in value:
                raise ValueError(f"header has no {where + '.' if where else ''}{key}")
            _check_shape(value[key], sub, f"{where + '.' if where else ''}{key}")
    elif not isinstance(value, schema) or (schema is int and isinstance(value, bool)):
        raise ValueError(f"header field {where} is not a{'n' if schema is int else ''} {schema.__name__}")


def check_context_path(path: Path | str) -> Path:
    """The cheap checks on a --context path, each its own line (before anything is loaded)."""
    if str(path) == "":
        raise KvpotError("--context needs the path of a saved context (it was empty)")
    path = Path(path).expanduser()
    if not path.exists():
        raise KvpotError(f"saved context {path} does not exist")
    if path.is_dir():
        raise KvpotError(f"saved context {path} is a directory, not a file saved with --save-context")
    if not path.is_file():
        raise KvpotError(f"saved context {path} is not a regular file")
    return path


def read_context(path: Path, seq_in_file: bool = False) -> SavedContext:
    """Read and check a saved context, the header's every field included (check_saved): anything
    wrong is one clear KvpotError, before any of it is used. `seq_in_file`: leave the sequence state in the
    file (a SeqInFile that llama.cpp restores from), where the platform can read it from there (POSIX)."""
    path = check_context_path(path)
    header, state = read_state(path, WHAT, _check_header_shape, seq_in_file)
    saved = SavedContext(header=header, state=state)
    check_saved(saved, path)
    return saved


def _check_header_shape(header) -> None:
    # the same container holds other state files (a `bench throughput` read's save): say which it is
    if isinstance(header, dict) and isinstance(header.get("format"), str) and header["format"] != FORMAT_NAME:
        raise ValueError(f"header field format is {describe(header['format'])}: not a saved context")
    _check_shape(header, _HEADER_SCHEMA, "")


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PROMPT_FORMATS = ("chat", "completion")
_MAX_SOURCES = 1 << 20


def check_saved(saved: SavedContext, path: Path | str = "saved context") -> None:
    """Every header field's type and range, and the engine's state against them (positions and cell
    counts within int32 and the context's size, settings as `ask` checks them, a policy spec kvpot
    runs, arrays and kvpot's C state of the shapes the header implies). A file with a right checksum
    can still be crafted or hand-edited: nothing in it reaches the engine or C code unchecked. Needs
    no model, so it runs before one loads (and under the fuzzer)."""
    try:
        _check_header(saved.header)
        st = saved.state
        n_ctx = saved.header["n_ctx"]
        check_engine_values(st.values, st.arrays, n_ctx)
        if saved.header["tokens_read"] > st.values["tokens_seen"]:
            raise ValueError("tokens_read is more than the engine's tokens_seen")
        if "read_point" in saved.header:
            point = ReadPoint.from_header(saved.header["read_point"])
            if point.next_position != st.values["tokens_seen"] or saved.header["turns"]:
                raise ValueError("read_point is not where the engine stopped reading")
        if "read_stopped" in saved.header:  # a read that stopped early (older contexts do not say)
            if ReadStopped.from_header(saved.header["read_stopped"]).tokens != saved.header["tokens_read"]:
                raise ValueError("read_stopped does not count the tokens read")
        check_pot_bytes(st.pot, st.arrays["positions"], st.values["pos_next"])
        check_policy_state(make_policy(saved.header["policy"]), st.values["policy"], st.arrays)
    except (ValueError, KvpotError) as e:
        raise KvpotError(f"saved context {path} is malformed: {one_line(e)}") from None


def _check_header(h: dict) -> None:
    schema = {k: v for k, v in _HEADER_SCHEMA.items() if k != "engine"}  # the engine's part is parsed apart
    _check_shape(h, schema | {"format": str, "kvpot_version": str, "prompt_format": str}, "")
    if h["format"] != FORMAT_NAME:
        raise ValueError(f"header field format is {describe(h['format'])}")
    if not _SHA256.match(h["model"]["sha256"]) or not isinstance(h["model"].get("architecture"), str):
        raise ValueError("header field model holds no sha256 digest or architecture")
    settings = h["settings"]
    for key, value in SAVED_BEFORE.items():  # a context saved before the setting existed was read so
        settings.setdefault(key, value)
    if set(settings) != set(KEYS):
        raise ValueError(f"header field settings has keys {sorted(settings)[:8]}, not {list(KEYS)}")
    for key in KEYS:
        problem = setting_problem(key, settings[key])
        if problem:
            raise ValueError(f"settings.{key} {problem}")
    if not isinstance(settings["budget"], int) or settings["threads"] < 1:
        raise ValueError("settings hold an unresolved budget or thread count")
    if settings["policy"] != h["policy"]:
        raise ValueError(f"policy {describe(h['policy'])} is not the one its settings name")
    if h["prompt_format"] not in _PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {', '.join(_PROMPT_FORMATS)}")
    if not 1 <= h["n_ctx"] <= MAX_CELLS:
        raise ValueError(f"n_ctx {h['n_ctx']} is outside 1..{MAX_CELLS}")
    for key, hi in (("tokens_read", INT64_MAX), ("turns", INT32_MAX)):
        if not 0 <= h[key] <= hi:
            raise ValueError(f"{key} {h[key]} is outside 0..{hi}")
    _check_sources(h["sources"])
    if "source_map" in h:  # --sources' map (older contexts have none)
        SourceMap.from_header(h["source_map"])


def _check_sources(sources: list) -> None:
    if len(sources) > _MAX_SOURCES:
        raise ValueError(f"header lists {len(sources)} sources")
    for src in sources:
        if not isinstance(src, dict) or not isinstance(src.get("name"), str):
            raise ValueError("a source in the header has no name")
        size = src.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= INT64_MAX):
            raise ValueError(f"source {src['name'][:40]!r} has size {repr(size)[:40]}")


def parse_context(data: bytes, path: Path | str = "saved context") -> SavedContext:
    """Check and decode the bytes of a saved context (the part the fuzzer drives)."""
    header, state = parse_state(data, path, WHAT, _check_header_shape)
    return SavedContext(header=header, state=state)
