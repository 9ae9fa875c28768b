"""Generated test text (no copied text): words, numbers, punctuation, code-ish lines, multibyte
characters, and optionally invalid UTF-8 bytes, from a seed."""

from __future__ import annotations

import random

WORDS = ("river stone lantern harbor quiet seven ledger copper north window winter engine signal "
         "garden mirror thunder pocket violet orbit canyon").split()
EXTRAS = ("Zoë", "naïve", "café", "数字", "😀", "—", "…", "über")


def text_block(seed: int, n_chars: int) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        r = rng.random()
        if r < 0.70:
            piece = rng.choice(WORDS) + rng.choice(("", "", "", ",", ".", ";"))
        elif r < 0.80:
            piece = str(rng.randint(0, 99999))
        elif r < 0.86:
            piece = rng.choice(EXTRAS)
        elif r < 0.93:
            piece = rng.choice(("\n", "\n\n", "\n    ", "\t"))
        else:
            piece = f"def f{rng.randint(0, 99)}(x): return x*{rng.randint(2, 9)}"
        out.append(piece)
        size += len(piece) + 1
    return " ".join(out)


def write_big_file(path, n_bytes: int, seed: int = 0, invalid_every: int = 0) -> int:
    """Write about n_bytes of text by repeating generated 1 MiB blocks; every `invalid_every`-th
    block gets an invalid UTF-8 byte. Returns the number of invalid bytes written."""
    blocks = [text_block(seed + i, 1 << 20).encode() for i in range(4)]
    written, bad, i = 0, 0, 0
    with open(path, "wb") as f:
        while written < n_bytes:
            b = blocks[i % len(blocks)]
            if invalid_every and i % invalid_every == 0:
                b = b + b" \xff "
                bad += 1
            f.write(b)
            written += len(b)
            i += 1
    return bad
