"""Training kvpot's trained parts on this machine, from documents on its own disk (`kvpot train`).

Features and labels come from the patched llama.cpp reading the training text, so any GGUF model
can get its trained parts without a model hub. The optimisation uses torch, an optional extra
(`pip install 'kvpot[train]'`); nothing else in kvpot needs it.
"""
