"""The owning-wrapper protocol of the bindings: one object, one C resource, freed once."""

from __future__ import annotations


class Owned:
    """Owns a C resource: `close()` frees it and may be called any number of times; a `with` block and
    garbage collection both call it, so a resource is freed even when the caller forgets."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
