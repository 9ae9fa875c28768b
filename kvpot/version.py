"""kvpot's version and the kvpot_* ABI it speaks: a leaf every layer may read (the runtime checks the ABI,
a saved context records the version), so none of them imports the package root, which is the API's door."""

__version__ = "0.1.0"

# the kvpot_* ABI this Python package speaks; must equal KVPOT_ABI_VERSION in ggml_ext/kvpot.h
ABI_VERSION = 16
