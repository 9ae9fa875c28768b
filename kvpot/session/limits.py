"""Bounds every cell count is checked against, wherever it comes from (options, the config file, a saved
context's header): a leaf module, so the settings, the checks and the context reader share them without
importing each other."""

# llama.cpp keeps context and batch sizes in uint32 and positions in int32; ctypes would wrap larger values
MAX_CELLS = 1 << 30
