"""Incremental tokenization of a text stream, cut at safe boundaries.

Text arrives in pieces; each is tokenized up to its last safe boundary and the rest waits for
the next piece. A safe boundary is just before a space that follows a non-space character and
precedes a letter or digit ("...word| next"): byte-level BPE pre-tokenizers (GPT-2 / Llama-3
style) always start a new pre-token there, and SentencePiece vocabularies (Gemma) have no
tokens that reach across "x▁y", so the tokens equal those of tokenizing the whole text at once.

Documented exceptions (the only places the tokens may differ from the whole-text ones):
  * a piece with no safe boundary in its last `max_hold` characters (e.g. minified code or a
    very long line without spaces) is cut at its last newline, or hard at the end;
  * tokens of the very first piece are those of a text without a preceding space.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

# "non-space, then a single space, then a word character": cut before the space
_SAFE = re.compile(r"(?<=\S) (?=\w)")


class IncrementalTokenizer:
    def __init__(self, tokenize: Callable[[str], list[int]], min_piece: int = 4096, max_hold: int = 1 << 16):
        self._tokenize = tokenize
        self._buf = ""
        self.min_piece = min_piece      # characters gathered before tokenizing (fewer, larger calls)
        self.max_hold = max_hold        # characters we may hold back while looking for a boundary
        self.hard_cuts = 0              # cuts that were not at a safe boundary (see module doc)
        self.chars = 0                  # characters tokenized so far
        self.bytes = 0                  # their UTF-8 size
        self.tokens = 0                 # tokens produced so far

    def feed(self, text: str) -> list[int]:
        """Tokens for the text up to the last safe boundary seen so far."""
        self._buf += text
        if len(self._buf) < self.min_piece:
            return []
        cut = self._safe_cut(self._buf)
        if cut <= 0:
            if len(self._buf) < self.max_hold:
                return []
            nl = self._buf.rfind("\n")
            cut = nl + 1 if nl > 0 else len(self._buf)
            self.hard_cuts += 1
        head, self._buf = self._buf[:cut], self._buf[cut:]
        return self._count(head)

    def flush(self) -> list[int]:
        """Tokens for whatever is left (end of input)."""
        head, self._buf = self._buf, ""
        return self._count(head) if head else []

    def _count(self, head: str) -> list[int]:
        toks = self._tokenize(head)
        self.chars += len(head)
        self.bytes += len(head.encode("utf-8"))
        self.tokens += len(toks)
        return toks

    @staticmethod
    def _safe_cut(buf: str) -> int:
        # search only the tail: the last boundary is almost always near the end
        for window in (512, 8192, len(buf)):
            start = max(0, len(buf) - window)
            last = -1
            for m in _SAFE.finditer(buf, start):
                last = m.start()
            if last > 0:
                return last
        return -1

    def stream(self, pieces: Iterable[str]) -> Iterator[list[int]]:
        """Token lists for a stream of text pieces (empty lists are not yielded)."""
        for piece in pieces:
            toks = self.feed(piece)
            if toks:
                yield toks
        toks = self.flush()
        if toks:
            yield toks
