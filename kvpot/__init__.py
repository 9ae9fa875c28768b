"""kvpot: long-document inference with a bounded, per-layer, per-KV-head KV memory inside llama.cpp.

Importing this package is cheap and never loads libllama; the runtime is loaded on
first use through :mod:`kvpot.runtime`.
"""

__version__ = "0.1.0"

# the kvpot_* ABI this Python package speaks; must equal KVPOT_ABI_VERSION in ggml_ext/kvpot.h
ABI_VERSION = 16
