"""What a saved context still holds of one line of its input, token by token: for each token of the
line, how many (layer, KV head) pairs of the pot keep its cell (docs/benchmarks.md, "Inside a phone's
memory": the 1M read's strongbox line). It answers "was the passage lost, or only part of it?" without
reading anything again: the saved `positions` array [L, H, N] holds the stream position of every kept
cell, and the saved source map places stream positions in the input's text.

    .venv/bin/python -m studies.pot_holds big.kvpot --find "the code of the strongbox" [--json F]

The inputs are read again (the names the context was saved with, relative to the current folder, or
--input), the first line holding --find is located, and the source-map entries around it are tokenized
again with the model's vocabulary. An entry covers GROUP tokens exactly, so a line is placed to the
token; if the text no longer tokenizes to the recorded count (the input changed), it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import sys
from bisect import bisect_right
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.sources import SourceMap, piece_chars
from kvpot.safe_write import write_text_file
from kvpot.session.context_file import read_context


def find_line(pieces, needle: str) -> tuple[str, int, int]:
    """(joined text up to past the line holding `needle`'s first occurrence, the line's start and end)."""
    parts: list[str] = []
    size, at = 0, -1
    tail = ""  # the last characters read, so a needle split between pieces is found
    for piece in pieces:
        parts.append(piece)
        window = tail + piece
        if at < 0 and (i := window.find(needle)) >= 0:
            at = size - len(tail) + i
        size += len(piece)
        tail = window[-len(needle):]
        if at >= 0 and "\n" in piece[max(at - (size - len(piece)), 0):]:
            break
    if at < 0:
        raise KvpotError(f"{needle!r} is not in the inputs")
    text = "".join(parts)
    end = text.find("\n", at)
    return text, text.rfind("\n", 0, at) + 1, len(text) if end < 0 else end


def line_tokens(smap: SourceMap, text: str, start: int, end: int, tokenize, piece) -> list[tuple[int, str]]:
    """(stream position, piece) of every token overlapping text[start:end], from the map's entries
    around it tokenized again."""
    ends = list(smap.char[1:]) + [smap.end_char]
    ends_pos = list(smap.pos[1:]) + [smap.end_pos]
    first = max(bisect_right(smap.char, start) - 1, 0)
    out = []
    j = first
    while j < len(smap.pos) and smap.char[j] < end:
        c0, c1 = smap.char[j], ends[j]
        toks = tokenize(text[c0:c1])
        if len(toks) != ends_pos[j] - smap.pos[j]:
            raise KvpotError(f"the input no longer tokenizes as it was read (entry at stream position "
                             f"{smap.pos[j]}: {len(toks)} tokens, {ends_pos[j] - smap.pos[j]} recorded)")
        pieces = [piece(t) for t in toks]
        # token offsets as SourceMap.add placed them: piece lengths scaled to the entry's characters
        cum = np.concatenate([[0], np.cumsum([piece_chars(b) for b in pieces])])
        at = c0 + cum * (c1 - c0) // max(int(cum[-1]), 1)
        out += [(smap.pos[j] + k, b.decode("utf-8", "replace")) for k, b in enumerate(pieces)
                if at[k + 1] > start and at[k] < end]
        j += 1
    return out


def holds(positions: np.ndarray, stream_pos: list[int]) -> list[int]:
    """Pairs (layer, KV head) whose kept cells include each stream position."""
    flat = positions.reshape(-1, positions.shape[-1])
    return [int((flat == q).any(axis=1).sum()) for q in stream_pos]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m studies.pot_holds", description=__doc__.split("\n\n")[0])
    ap.add_argument("context", help="a saved context (kvpot ask/chat --save-context)")
    ap.add_argument("--find", required=True, help="text on the line to look at (its first occurrence)")
    ap.add_argument("--input", action="append", help="the inputs, where not at the names saved (repeat, in order)")
    ap.add_argument("--json", help="write the rows here too")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    from kvpot.ingest import collect_sources
    from kvpot.runtime.llama import LlamaModel

    try:
        saved = read_context(Path(a.context))
        smap = SourceMap.from_header(saved.header.get("source_map"))
        if not smap.pos:
            raise KvpotError(f"{a.context} holds no source map (saved before kvpot recorded one)")
        names = a.input or [s["name"] for s in saved.header["sources"]]
        src = collect_sources(names, "*", notice=lambda msg: None)
        text, start, end = find_line(src.pieces(), a.find)
        model = LlamaModel(saved.header["model"]["path"], vocab_only=True)
        toks = line_tokens(smap, text, start, end, model.tokenize, model.piece)
    except KvpotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    positions = saved.state.arrays["positions"]
    pairs = positions.shape[0] * positions.shape[1]
    counts = holds(positions, [q for q, _ in toks])
    print(f"line: {text[start:end]!r}")
    print(f"stream positions {toks[0][0]}-{toks[-1][0]} of {smap.end_pos}; pairs (layer, KV head) holding each token, of {pairs}:")
    for (q, p), n in zip(toks, counts):
        print(f"  {q:>10}  {p!r:<16} {n}")
    if a.json:
        write_text_file(a.json, json.dumps({"context": a.context, "line": text[start:end], "pairs": pairs,
                                            "end_pos": smap.end_pos,
                                            "tokens": [{"pos": q, "piece": p, "held_by": n}
                                                       for (q, p), n in zip(toks, counts)]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
