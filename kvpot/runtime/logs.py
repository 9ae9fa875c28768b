"""llama.cpp's log: errors reach stderr, info and warnings do not (they would break the progress
bar). The filter is C (ggml_ext/kvpot-log.cpp, which also names the harmless errors it drops):
a Python callback would need the interpreter lock for every message, from backend threads and
during interpreter exit too, where taking it can crash the process."""

from __future__ import annotations

import os

from kvpot.errors import KvpotError
from kvpot.runtime.library import load
from kvpot.safe_write import check_append_target

ENV = "KVPOT_LLAMA_LOG"  # a file for llama.cpp's whole log (load, placement, warnings), as llama.cpp's --log-file
ROLE = f"the llama.cpp log ({ENV})"  # what the log is in the never-write set (kvpot.safe_write)

_state: dict = {"installed": False, "path": None}


def install(path: str | os.PathLike | None = None) -> None:
    """Route llama.cpp's and ggml's log through kvpot's C filter. With `path`, every message of
    every level is also appended to that file (tests read llama.cpp's load log from it; users set
    KVPOT_LLAMA_LOG=FILE for the same); a later call with another path replaces the file, "" stops
    it, and a call without a path keeps the current one."""
    if _state["installed"] and (path is None or str(path) == _state["path"]):
        return
    from_env = path is None and not _state["installed"] and bool(os.environ.get(ENV))
    if from_env:
        path = os.environ[ENV]
    target = str(path) if path is not None else _state["path"]
    if target and target != _state["path"]:  # C opens it for appending: checked first (kvpot.safe_write)
        check_append_target(target, f"{ENV}={target}" if from_env else f"the llama.cpp log {target}", own_role=ROLE)
    lib = load()
    if lib.kvpot_log_setup(target.encode() if target else None) < 0:
        why = lib.kvpot_last_error().decode(errors="replace")
        raise KvpotError(f"{ENV}: {why}" if from_env else why)
    _state.update(installed=True, path=target)


def path() -> str | None:
    """The file every message is appended to, if one was given."""
    return _state["path"]
