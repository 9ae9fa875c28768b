"""kvpot: long-document inference with a bounded, per-layer, per-KV-head KV memory inside llama.cpp.

    import kvpot
    doc = kvpot.Model("qwen2.5-coder-0.5b").read("notes.txt")
    print(doc.ask("Which port does the server use?").text)

Importing this package is cheap and never loads libllama: the API (kvpot.api) is imported on first use of
one of its names, and the runtime is loaded when a model is.
"""

from kvpot.version import ABI_VERSION, __version__

# the API's names, imported from kvpot.api when first used
API = ("Answer", "Document", "KvpotError", "Model", "Plan")
__all__ = [*API, "ABI_VERSION", "__version__"]


def __getattr__(name: str):
    if name in API:
        import kvpot.api  # lazy: importing kvpot loads neither the API nor what it stands on

        return getattr(kvpot.api, name)
    raise AttributeError(f"module 'kvpot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
