"""llama.cpp's log: errors reach stderr, info and warnings do not (they would break the progress
bar), and two messages that are harmless for kvpot are dropped, each with its reason."""

from __future__ import annotations

import ctypes
import sys

# ggml_log_level
_ERROR, _CONT = 3, 5

HARMLESS = (
    # Gemma-3 GGUFs mark '</s>' as a normal token; llama.cpp fixes the type at load and says so
    "was not control-type; this is probably a bug in the model",
    # kvpot's tap and log-prob graphs are larger than the graph llama.cpp reserved its compute
    # buffer for; the scheduler grew the buffer, and the destructor reports the difference
    "does not match expectation of",
)

_state = {"forwarding": False}
_callback = None


def install() -> None:
    """Route llama.cpp's log through the filter (once per process)."""
    global _callback
    if _callback is not None:
        return
    import llama_cpp

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data) -> None:
        if level == _CONT:
            forward = _state["forwarding"]
        else:
            msg = text.decode("utf-8", errors="replace")
            forward = level == _ERROR and not any(h in msg for h in HARMLESS)
            _state["forwarding"] = forward
        if forward:
            sys.stderr.write(text.decode("utf-8", errors="replace"))
            sys.stderr.flush()

    _callback = on_log  # keep the ctypes callback alive for the life of the process
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
