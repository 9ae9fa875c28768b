"""Raw ctypes declarations of the kvpot_* C API (ggml_ext/kvpot.h), C signature beside each.

Nothing here owns resources; `kvpot.runtime.library` binds these to the loaded libllama.
"""

from __future__ import annotations

import ctypes

# (name, restype, argtypes) -- kept in the order of kvpot.h
SIGNATURES: list[tuple[str, object, list]] = [
    # const char * kvpot_version(void);
    ("kvpot_version", ctypes.c_char_p, []),
    # int32_t kvpot_abi_version(void);
    ("kvpot_abi_version", ctypes.c_int32, []),
    # const char * kvpot_llama_commit(void);
    ("kvpot_llama_commit", ctypes.c_char_p, []),
    # const char * kvpot_backends(void);
    ("kvpot_backends", ctypes.c_char_p, []),
]


def declare(lib: ctypes.CDLL) -> None:
    """Set restype/argtypes on every kvpot_* symbol; AttributeError if one is missing."""
    for name, restype, argtypes in SIGNATURES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
