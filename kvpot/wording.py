"""Numbers in sentences: "1 compaction", "2 compactions", "1.5 GiB"."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None) -> str:
    """`n` and the noun that agrees with it (`words`: an irregular plural)."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"



def size_text(n: int) -> str:
    """Bytes as a reader wants them: GiB from 1 GiB up, else MiB, KiB or bytes (never "0.0 GiB")."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / 2**shift:,.1f} {unit}"
    return f"{n:,} bytes"
