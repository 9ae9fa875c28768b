"""Where a stopped read goes on: the place in the inputs of the first token the pot has not read.

A read stopped by Ctrl-C keeps every chunk decoded before it (kvpot.runtime.abort takes the chunk in
progress back), so the pot holds a prefix of the token stream. To go on later, a reopened context must
produce exactly the tokens that stream would have held next. The incremental tokenizer cuts the text
only at boundaries no token spans (kvpot.ingest.tokenstream), so the text from the start of any piece it
tokenized gives the same tokens whatever was cut before it: the point is the character offset where the
piece holding the next token starts, and how many of that piece's tokens were already read.

The inputs must still hold the text that was read: the SHA-256 of the joined text before the point is
recorded and checked before anything more is read (a file edited or replaced since is refused, not
silently continued from the wrong place). Streams (stdin, pipes) cannot be read again, so a read of one
has no point.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet, collect_sources

# tokenized pieces remembered (as int32 arrays, at most a few MiB): a read holds two chunks and a piece ahead of
# what it decoded, and a piece is 4,096 characters or more, so the next token is always in one of the last few
PIECES_KEPT = 16


@dataclass(frozen=True)
class ReadPoint:
    pos: int            # stream position of the first token of the piece the next token is in
    skip: int           # tokens of that piece already read (the next token is at pos + skip)
    char: int           # character offset of that piece in the joined text
    sha256: str         # of the joined text's first `char` characters, UTF-8
    skip_sha256: str    # of the `skip` tokens read of that piece, as little-endian int32 ids
    sources: tuple[tuple[str, str], ...]  # (name, absolute path) of every source, in reading order

    def to_header(self) -> dict:
        return {"pos": self.pos, "skip": self.skip, "char": self.char, "sha256": self.sha256,
                "skip_sha256": self.skip_sha256, "sources": [[name, path] for name, path in self.sources]}

    @classmethod
    def from_header(cls, h) -> ReadPoint:
        """Checked field by field (a saved context's header can be hand-edited): ValueError if malformed."""
        if not isinstance(h, dict) or set(h) != {"pos", "skip", "char", "sha256", "skip_sha256", "sources"}:
            raise ValueError("read_point must hold pos, skip, char, sha256, skip_sha256 and sources")
        for key in ("pos", "skip", "char"):
            v = h[key]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 62:
                raise ValueError(f"read_point.{key} is not a count")
        for key in ("sha256", "skip_sha256"):
            sha = h[key]
            if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise ValueError(f"read_point.{key} is not a SHA-256 digest")
        srcs = h["sources"]
        if not isinstance(srcs, list) or not srcs or not all(
                isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) and x for x in s) for s in srcs):
            raise ValueError("read_point.sources must list [name, path] pairs")
        if not all(os.path.isabs(path) for _, path in srcs):
            raise ValueError("read_point.sources must give absolute paths")
        return cls(h["pos"], h["skip"], h["char"], h["sha256"], h["skip_sha256"], tuple((n, p) for n, p in srcs))

    @property
    def next_position(self) -> int:
        return self.pos + self.skip

    def names(self) -> str:
        return ", ".join(name for name, _ in self.sources)

    def check_skipped(self, tokens: list[int]) -> None:
        """The resumed piece's tokens: those before the point must be the ones that were read (the text
        digest covers only what comes before the piece)."""
        if len(tokens) < self.skip or tokens_sha256(tokens[:self.skip]) != self.skip_sha256:
            raise KvpotError(f"{self.names()} changed since the context was saved: the text read last before "
                             "it stopped is not there any more")


def tokens_sha256(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


class PieceLog:
    """What a read tokenized lately: each piece's stream position, token count, character offset and the
    digest of the text before it. `tokenize` wraps the model's, so every piece the tokenizer cuts passes
    here in order; `piece_read(at, n)` then gives it its stream position."""

    def __init__(self, tokenize, char0: int = 0, digest=None):
        self._tokenize = tokenize
        self._digest = digest if digest is not None else hashlib.sha256()
        self._char = char0
        self._last: tuple[int, object] | None = None     # the piece just tokenized: (char, digest before it)
        self.last_text = ""                               # and its text (the source map digests it)
        self._pieces: deque[tuple[int, np.ndarray, int, object]] = deque(maxlen=PIECES_KEPT)

    def tokenize(self, text: str) -> list[int]:
        self._last = (self._char, self._digest.copy())
        self.last_text = text
        self._digest.update(text.encode("utf-8"))
        self._char += len(text)
        return self._tokenize(text)

    def piece_read(self, pos: int, tokens: list[int]) -> None:
        """The piece just tokenized went to stream positions pos, pos+1, ..."""
        char, digest = self._last
        self._pieces.append((pos, np.asarray(tokens, dtype="<i4"), char, digest))

    def point(self, next_position: int, sources: tuple[tuple[str, str], ...]) -> ReadPoint | None:
        """The point of the token at `next_position` (the first not read), None where no remembered piece
        holds it (the read stopped before its first document token)."""
        for pos, tokens, char, digest in self._pieces:
            if pos <= next_position <= pos + len(tokens):
                skip = next_position - pos
                return ReadPoint(pos, skip, char, digest.hexdigest(), tokens_sha256(tokens[:skip]), sources)
        return None


def resumable_sources(sources: SourceSet) -> tuple[tuple[str, str], ...] | None:
    """(name, absolute path) of each source, None where one is a stream (it cannot be read again)."""
    out = []
    for s in sources.sources:
        if s.is_stream or s.path is None:
            return None
        out.append((s.name, str(Path(s.path).resolve())))
    return tuple(out)


def reopen_sources(point: ReadPoint, notice=None) -> SourceSet:
    """The inputs a stopped read was reading, found again at their paths, each read as it was then
    (its kind told from its content) and named as it was (the headers between sources are part of the
    text the digest covers)."""
    from dataclasses import replace


    found = []
    for name, path in point.sources:
        if not os.path.isfile(path):
            raise KvpotError(f"{name} is no longer at {path}: the rest of it cannot be read")
        one = collect_sources([path], ["*"], notice=notice or (lambda msg: None))
        if len(one.sources) != 1:
            raise KvpotError(f"{name} at {path} cannot be read as it was ({'; '.join(one.skipped) or 'unreadable'})")
        found.append(replace(one.sources[0], name=name))
    out = SourceSet(sources=found)
    if notice is not None:
        out.warn = notice
    return out


def text_after(sources: SourceSet, point: ReadPoint) -> tuple[Iterator[str], hashlib._Hash, int]:
    """The joined text from the point on, after checking that the text before it is what was read.
    Returns the rest as pieces, the digest of the text before the point (it goes on over the rest) and
    that text's size in UTF-8 bytes."""
    it = sources.pieces()
    digest = hashlib.sha256()
    left = point.char
    size = 0
    first = ""
    while left > 0:
        piece = next(it, None)
        if piece is None:
            raise KvpotError(f"{point.names()} changed since the context was saved: it now ends before the "
                             f"{point.char:,} characters that were read")
        head, first = piece[:left], piece[left:]
        data = head.encode("utf-8")
        digest.update(data)
        size += len(data)
        left -= len(head)
    if digest.hexdigest() != point.sha256:
        raise KvpotError(f"{point.names()} changed since the context was saved: its first {point.char:,} "
                         "characters are not the text that was read")

    def rest() -> Iterator[str]:
        if first:
            yield first
        yield from it

    return rest(), digest, size


@dataclass(frozen=True)
class ReadStopped:
    """A read that stopped before the end of its input (Ctrl-C, a signal), as a saved context records it
    whether or not it can go on: a reopened context says that its input was read only partly, and
    `--continue` says why it cannot read the rest where there is no read point (a stream: stdin or a
    pipe is read once)."""
    tokens: int               # document tokens read
    of_tokens: int | None     # the input's estimated length in tokens when it stopped (None: unknown)
    bytes_read: int           # bytes of the input read when it stopped (the reader runs a little ahead)
    of_bytes: int | None      # the input's size (None: a stream of unknown length)
    stream: bool              # an input was a stream, which cannot be read again

    def to_header(self) -> dict:
        return {"tokens": self.tokens, "of_tokens": self.of_tokens, "bytes_read": self.bytes_read,
                "of_bytes": self.of_bytes, "stream": self.stream}

    @classmethod
    def from_header(cls, h) -> ReadStopped:
        """Checked field by field: ValueError if malformed."""
        if not isinstance(h, dict) or set(h) != {"tokens", "of_tokens", "bytes_read", "of_bytes", "stream"}:
            raise ValueError("read_stopped must hold tokens, of_tokens, bytes_read, of_bytes and stream")
        for key in ("tokens", "of_tokens", "bytes_read", "of_bytes"):
            v = h[key]
            if v is None and key.startswith("of_"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 62:
                raise ValueError(f"read_stopped.{key} is not a count")
        if not isinstance(h["stream"], bool):
            raise ValueError("read_stopped.stream is not a boolean")
        return cls(h["tokens"], h["of_tokens"], h["bytes_read"], h["of_bytes"], h["stream"])

    def describe(self) -> str:
        """How much was read: "354 of ~5,000 tokens (20,480 of 19,811 bytes read)"."""
        of = f" of ~{self.of_tokens:,}" if self.of_tokens and self.of_tokens > self.tokens else ""
        size = f"{self.bytes_read:,} of {self.of_bytes:,}" if self.of_bytes else f"{self.bytes_read:,}"
        return f"{self.tokens:,}{of} tokens (the reader had taken {size} bytes of the input)"


def why_no_rest(stopped: ReadStopped | None, turns: int) -> str:
    """Why a context whose read stopped early has no rest to read (it has no read point)."""
    if stopped is not None and stopped.stream:
        return "the input was a stream (stdin or a pipe), which cannot be read again"
    if turns:
        return f"it was saved after {turns:,} turns of conversation, so it cannot read on"
    return "where it stopped was not recorded"


def cannot_continue(context, stopped: ReadStopped | None, turns: int) -> str:
    """What `--continue` says of a context with no read point (its header's read_stopped and turns)."""
    if stopped is None:
        return (f"{context} holds no stopped read to continue: it was read to its end"
                + (" and answered" if turns else ""))
    return (f"{context} holds a read stopped after {stopped.describe()}, and {why_no_rest(stopped, turns)}: "
            "--continue cannot read the rest (read the whole input again)")
