"""How far a benchmark's reading is, as one line: a case past the window reads for up to an hour, and a
grid that says nothing meanwhile cannot be told from a hung one. The words are those of `kvpot ask`'s
progress lines in a log (cli/reading.py)."""

from __future__ import annotations

from kvpot.wording import plural


def reading_line(what: str, tokens: int, total: int | None, seconds: float, compactions: int,
                 before: int = 0) -> str:
    """`what`: the case ("default 131,072, sort-authors"); `total`: the tokens the whole reading holds,
    or None when unknown; `seconds`: the time this process read for, the tokens after `before` (a
    reading gone on from a save: the rate is of what this part read)."""
    of = f" of ~{total:,}" if total else ""
    return (f"{what}: read {tokens:,}{of} tokens, {(tokens - before) / max(seconds, 1e-9):,.0f} tok/s, "
            f"{plural(compactions, 'compaction')}")
