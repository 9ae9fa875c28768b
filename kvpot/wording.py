"""Numbers in sentences: "1 compaction", "2 compactions"."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None) -> str:
    """`n` and the noun that agrees with it (`words`: an irregular plural)."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"

