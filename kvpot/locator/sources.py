"""Where an answer comes from (`--sources`): the passages of the input its tokens attended to most.

Three records meet here:
  * the engine's `positions` [L, H, N]: the stream position of every kept cell, per layer and KV
    head. It follows every compaction, InfLLM's recalled and fetched blocks, and saved contexts,
    so nothing here tracks cells;
  * the engine's `answer_mass`: the attention the answer's rows gave each stream position, summed
    over layers, KV heads and rows (score taps, `Engine.track_answer_attention`);
  * a `SourceMap` built while reading: stream position -> character offset of the joined text, one
    entry per GROUP tokens (memory grows by 24 bytes per GROUP tokens, about 375 KiB per million),
    and the input's marks (file, page, chapter or line of each piece, `SourceSet.marks`), with a short
    digest of each entry's text as it was read.

Passages are fixed runs of PASSAGE_TOKENS stream positions; their score is the mass they received,
their quote is read back from the inputs (`quote`), which works whenever the inputs are still there.
A quote is given only where the text read back has the digests of the text that was read: a file
changed since (edited, rewritten, replaced) is said to have changed, and its passages are not quoted
(the text there now is not what the model read). A context saved before the digests were recorded
is quoted as it reads now, with a note that this could not be checked.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.ingest.sources import STDIN, Mark, SourceSet, header

GROUP = 64             # tokens per offset entry: the map's resolution is exact at every GROUP-th token
PASSAGE_TOKENS = 24    # a passage: about one sentence
TOP = 3                # passages shown
SINK_TOKENS = 4        # the stream's first tokens: attention sinks, never a source (see rank)
# a token counts at most SPIKE times the most its NEIGHBOURS on either side hold (see rank): a lone token that takes
# far more than its neighbours is a sink (the context's first full stop, a delimiter), whatever the question
SPIKE = 4.0
NEIGHBOURS = 2
QUOTE_CHARS = 160      # longest quote
WORD_REACH = 24        # characters a quote is widened by, each side, to the words its ends cut
LONG_LINE = 400        # characters into its line past which a place also says its column
DIGEST_BYTES = 8       # of each entry's text (BLAKE2b): a changed file is told apart, at 8 bytes per entry


def piece_chars(piece: bytes) -> int:
    """Characters of a token's piece: its UTF-8 bytes that do not continue a sequence."""
    return sum(1 for b in piece if b & 0xC0 != 0x80)


@dataclass
class SourceMap:
    """Stream position -> character offset of the joined input text, plus where each piece came from."""

    pos: array = field(default_factory=lambda: array("q"))    # stream position of an entry's token
    char: array = field(default_factory=lambda: array("q"))   # its character offset in the joined text
    end_pos: int = 0                                           # past the last document token
    end_char: int = 0
    marks: list[Mark] = field(default_factory=list)
    # per entry, the digest of its text (the joined text from its character offset to the next entry's) as it
    # was read; None: a map saved before digests were recorded (or built without the text), nothing to check
    digests: list[bytes] | None = field(default_factory=list)
    _chars_of: dict[int, int] = field(default_factory=dict, repr=False)  # token -> characters of its piece

    def add(self, first_pos: int, char0: int, n_chars: int, tokens: Sequence[int], piece,
            text: str | None = None) -> None:
        """Record one tokenized run of text: `tokens` at stream positions first_pos.., from the n_chars
        characters at char0. Token lengths come from `piece(token) -> bytes`, scaled to n_chars (a
        SentencePiece vocabulary adds a leading space the text did not have). `text`: the run's text,
        whose entries' digests are kept (without it, the map keeps none)."""
        if not tokens:
            return
        lens = np.fromiter((self._token_chars(t, piece) for t in tokens), dtype=np.int64, count=len(tokens))
        cum = np.concatenate([[0], np.cumsum(lens)])
        total = max(int(cum[-1]), 1)
        starts = [int(cum[i]) * n_chars // total for i in range(0, len(tokens), GROUP)]
        for i, start in zip(range(0, len(tokens), GROUP), starts):
            self.pos.append(first_pos + i)
            self.char.append(char0 + start)
        if text is None or len(text) != n_chars:
            self.digests = None
        elif self.digests is not None:
            self.digests += [text_digest(text[a:b]) for a, b in zip(starts, starts[1:] + [n_chars])]
        self.end_pos, self.end_char = first_pos + len(tokens), char0 + n_chars

    def truncate(self, pos: int, char: int) -> None:
        """Forget the entries from stream position `pos` on (a stopped read mapped pieces it had tokenized
        but not read); `char`: the character offset of the token at `pos`, where the map now ends."""
        keep = bisect_right(self.pos, pos - 1)
        del self.pos[keep:], self.char[keep:]
        if self.digests is not None:
            del self.digests[keep:]
        self.end_pos, self.end_char = pos, char

    def _token_chars(self, token: int, piece) -> int:
        n = self._chars_of.get(token)
        if n is None:
            n = self._chars_of[token] = piece_chars(piece(token))
        return n

    def offset(self, position: int) -> int | None:
        """Character offset of the token at a stream position (None: not a document token)."""
        if not self.pos or not self.pos[0] <= position < self.end_pos:
            return None
        i = bisect_right(self.pos, position) - 1
        nxt_pos = self.pos[i + 1] if i + 1 < len(self.pos) else self.end_pos
        nxt_char = self.char[i + 1] if i + 1 < len(self.char) else self.end_char
        return self.char[i] + (position - self.pos[i]) * (nxt_char - self.char[i]) // max(nxt_pos - self.pos[i], 1)

    def where(self, offset: int) -> Mark | None:
        i = bisect_right([m.offset for m in self.marks], offset) - 1
        return self.marks[i] if i >= 0 else None

    # -- saved contexts ----------------------------------------------------------------------------

    def entry_end(self, i: int) -> int:
        """Character offset where entry i's text ends (the next entry's start, or the map's end)."""
        return self.char[i + 1] if i + 1 < len(self.char) else self.end_char

    def to_header(self) -> dict:
        out = {"pos": list(self.pos), "char": list(self.char), "end": [self.end_pos, self.end_char],
               "marks": [[m.offset, m.source, m.where] for m in self.marks]}
        if self.digests is not None:
            out["digests"] = b"".join(self.digests).hex()
        return out

    @classmethod
    def from_header(cls, h) -> SourceMap:
        """The map a context was saved with; one saved before sources were recorded maps nothing."""
        if h is None:
            return cls()
        try:
            pos, char = array("q", h["pos"]), array("q", h["char"])
            end_pos, end_char = (int(v) for v in h["end"])
            marks = [Mark(int(o), str(s), str(w)) for o, s, w in h["marks"]]
            digests = None
            if "digests" in h:  # older contexts have none
                raw = bytes.fromhex(h["digests"])
                if len(raw) != DIGEST_BYTES * len(pos):
                    raise ValueError("a digest per entry")
                digests = [raw[i:i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES)]
        except (KeyError, TypeError, ValueError, OverflowError):
            raise KvpotError("its source map is malformed") from None
        if len(pos) != len(char) or any(b <= a for a, b in zip(pos, pos[1:])) or \
                any(b < a for a, b in zip(char, char[1:])) or (pos and (end_pos < pos[-1] or end_char < char[-1])):
            raise KvpotError("its source map is not in reading order")
        return cls(pos=pos, char=char, end_pos=end_pos, end_char=end_char, marks=marks, digests=digests)


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True)
class Passage:
    source: str          # file name
    where: str           # "p. 12", "line 40", "ch. 3"
    start: int           # character offsets of the joined text
    end: int
    share: float         # of the attention the answer gave the document
    quote: str = ""      # "" when the inputs cannot be read again (stdin, moved files) or changed since
    note: str = ""       # why a quote is missing or unchecked: CHANGED, UNCHECKED, or ""

    def as_dict(self) -> dict:
        out = {"source": self.source, "where": self.where, "start": self.start, "end": self.end,
               "share": round(self.share, 4), "quote": self.quote}
        if self.note:
            out["note"] = self.note
        return out


# Passage.note: the text read back is not the text that was read (not quoted); no digest was recorded to check
CHANGED = "changed since it was read"
UNCHECKED = "not checked"


def position_at(smap: SourceMap, char: int) -> int:
    """The first stream position of the map whose token starts at or after character `char` (the map's end
    when none does): the inverse of `SourceMap.offset`, at its resolution."""
    lo, hi = smap.pos[0], smap.end_pos
    while lo < hi:
        mid = (lo + hi) // 2
        if smap.offset(mid) < char:
            lo = mid + 1
        else:
            hi = mid
    return lo


def file_chars(smap: SourceMap, stretches: list[tuple[int, int]] | None = None) -> list[tuple[int, int, str]]:
    """Character ranges [start, end) of the joined text that belong to one input each, with its name, in order.
    Several inputs are joined with a heading line before each (kvpot.ingest.sources.header: the first's
    heading before its first mark, the others' between the previous input's text and their first mark), and
    a heading belongs to no input. `stretches`: the ranges where the text says itself what they are (a
    focused read's passages, each of its own place: FocusText.stretches)."""
    if stretches is not None:
        return [(a, b, (smap.where(a).source if smap.where(a) else "")) for a, b in stretches]
    if not smap.marks:
        return [(0, smap.end_char, "")]
    firsts = [m for i, m in enumerate(smap.marks) if i == 0 or m.source != smap.marks[i - 1].source]
    if len(firsts) == 1:
        return [(0, smap.end_char, firsts[0].source)]
    ends = [max(m.offset - len(header(m.source)), 0) for m in firsts[1:]] + [smap.end_char]
    return [(m.offset, max(end, m.offset), m.source) for m, end in zip(firsts, ends)]


def file_positions(smap: SourceMap, stretches: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Stream positions [first, end) of each input's own text (`file_chars`), the inputs' headings left out."""
    if not smap.pos:
        return []
    out = []
    for a, b, _ in file_chars(smap, stretches):
        p0, p1 = position_at(smap, a), position_at(smap, b)
        if p0 < p1:
            out.append((p0, p1))
    return out


def rank(mass: dict[int, float], smap: SourceMap, top: int = TOP, sinks: int = SINK_TOKENS,
         stretches: list[tuple[int, int]] | None = None) -> list[tuple[int, int, float]]:
    """(first position, last position + 1, share) of the `top` passages with the most mass, best first:
    runs of PASSAGE_TOKENS centred where the most mass gathers (a sentence is not split at a fixed
    boundary), each taking its mass from the ones after it. Only document tokens count (not the
    prompt's, the question's or the answer's, nor the headings that join several inputs), a passage
    never runs from one input into the next (`file_positions`), and not the stream's first `sinks`: the
    attention sinks every head dumps mass on (StreamingLLM; at least SINK_TOKENS, more where the policy
    keeps more, Policy.sink_tokens), which would otherwise top every list. Sinks form past the first tokens
    too, on a lone token the model parks attention on whatever the question (Qwen2.5 on a document's first
    full stop: 2 % of the answer's attention on one token, 20 times its neighbours'), so a token counts at
    most SPIKE times the most its NEIGHBOURS on either side hold: the words of a passage the answer reads
    are attended to together, a sink alone."""
    return rank_in(mass, file_positions(smap, stretches), top, sinks) if smap.pos else []


def rank_between(mass: dict[int, float], first: int, end: int, top: int = TOP,
                 sinks: int = SINK_TOKENS) -> list[tuple[int, int, float]]:
    """`rank` over the document tokens at stream positions [first, end), without a SourceMap
    (`kvpot bench niah --sources` knows where its haystack lies in the stream)."""
    return rank_in(mass, [(first, end)], top, sinks)


def rank_in(mass: dict[int, float], parts: list[tuple[int, int]], top: int = TOP,
            sinks: int = SINK_TOKENS) -> list[tuple[int, int, float]]:
    """`rank` over the stream positions of `parts` ([first, end) each, in order, disjoint): a passage lies in
    one part, the mass outside them does not count."""
    floor = max(sinks, SINK_TOKENS)
    parts = [(max(a, floor), b) for a, b in parts if b > max(a, floor)]
    if not parts:
        return []
    lo_of = np.array([a for a, _ in parts], dtype=np.int64)
    hi_of = np.array([b for _, b in parts], dtype=np.int64)
    pos = np.array(sorted(mass), dtype=np.int64)
    part = np.searchsorted(lo_of, pos, side="right") - 1
    inside = (part >= 0) & (pos < hi_of[np.maximum(part, 0)])
    pos, part = pos[inside], part[inside]
    if not pos.size:
        return []
    m = np.array([mass[p] for p in pos.tolist()], dtype=np.float64)
    m = np.minimum(m, SPIKE * _neighbours(m))
    total = float(m.sum())
    lo, hi = lo_of[part], hi_of[part]
    half = PASSAGE_TOKENS // 2
    first = np.searchsorted(pos, np.maximum(pos - half, lo))          # the run centred on each position: [first, last)
    last = np.searchsorted(pos, np.minimum(pos + PASSAGE_TOKENS - half, hi))
    out = []
    for _ in range(top):
        cum = np.concatenate([[0.0], np.cumsum(m)])
        got = cum[last] - cum[first]
        k = int(np.argmax(got))
        if got[k] <= 0:
            break
        p0 = max(int(pos[k]) - half, int(lo[k]))
        out.append((p0, min(p0 + PASSAGE_TOKENS, int(hi[k])), float(got[k]) / total))
        m[first[k]:last[k]] = 0.0  # the next passage is another one
    return out


def _neighbours(m: np.ndarray, reach: int = NEIGHBOURS) -> np.ndarray:
    """Each token's neighbourhood level: the most any of the `reach` tokens on either side of it holds."""
    padded = np.pad(m, reach)
    near = np.lib.stride_tricks.sliding_window_view(padded, 2 * reach + 1).copy()
    near[:, reach] = 0.0  # not the token itself
    return near.max(axis=1)


def ranked_passages(mass: dict[int, float], session, top: int = TOP) -> list[Passage]:
    """The `top` passages `mass` (stream position -> attention) drew on most in the session's input, best first,
    unquoted (`passages_in`). Offsets and places are the joined text's of the session's own input (a focused
    read's text, not yet the original inputs')."""
    src = session.source_set
    return passages_in(mass, session.source_map, session.engine.policy.sink_tokens(), top,
                       getattr(src, "in_heading", None), src.stretches() if hasattr(src, "stretches") else None)


def passages_in(mass: dict[int, float], smap: SourceMap, sinks: int, top: int = TOP, heading=None,
                stretches: list[tuple[int, int]] | None = None) -> list[Passage]:
    """The ranking `--sources` shows and a focused read reads again (kvpot.session.focus), one for both: the `top`
    passages with the most mass (`rank`), best first, as characters [start, end) of the joined text inside the
    input that holds them, with that input's name and recorded place. `heading(offset)`: whether a character
    is in a heading that names a place rather than text of the input (a focused read's: FocusText.in_heading);
    `stretches`: FocusText.stretches."""
    files = file_chars(smap, stretches)
    if heading is not None:
        mass = {p: m for p, m in mass.items() if not heading(smap.offset(p) or 0)}
    out = []
    # twice as many ranked as shown: a passage before the first mark is the heading of the first source, and one
    # in a focused read's headings names a place, neither is text of the input
    for p0, p1, share in rank(mass, smap, 2 * top, sinks, stretches):
        a = smap.offset(p0)
        b = smap.end_char if p1 >= smap.end_pos else smap.offset(p1)
        if a is None or b is None:
            continue
        # the passage's characters inside the input that holds its first token (the map's offsets between
        # its exact entries are interpolated: a passage's end may reach a few characters past its input's)
        a, b = next(((max(a, lo), min(b, hi)) for lo, hi, _ in files if lo <= a < hi), (a, b))
        mark = smap.where(a)
        if mark is None and smap.marks:
            continue
        out.append(Passage(mark.source if mark else "", mark.where if mark else "", a, max(a, b), share))
    return out[:top]


def top_passages(session, top: int = TOP, mass: dict[int, float] | None = None) -> list[Passage]:
    """The passages the last answer drew on most (`mass`: another answer's attention, e.g. a focused read's
    locating answer), with quotes and lines where the inputs can be read again."""
    found = quote(ranked_passages((session.engine.answer_mass or {}) if mass is None else mass, session, top),
                  reread(session), session.source_map)
    # a focused read's text is passages of the inputs (kvpot.session.focus): offsets of the inputs' own text
    to_input = getattr(session.source_set, "input_offset", None)
    if to_input is None:
        return found
    return [replace(p, start=to_input(p.start), end=to_input(p.end)) for p in found]


def reread(session) -> SourceSet | None:
    """The inputs again, for quotes: the session's own (files read again), or, for a reopened context,
    its files collected again; None when they cannot be (stdin, a file gone)."""
    if session.source_set is not None:
        src = session.source_set
        return src if src.can_read_again() else None
    names = [s["name"] for s in session.sources]
    if STDIN in names:  # read once, gone (and reading it again would wait on the terminal)
        return None
    try:
        again = collect_sources(names, "*", notice=lambda msg: None) if names else None
    except KvpotError:
        return None
    if again is not None:
        again.warn = lambda msg: None  # what reading them met was said when they were read
    return again


def quote(passages: list[Passage], text: SourceSet | None, smap: SourceMap) -> list[Passage]:
    """Fill in each passage's quote (and its line, for text inputs marked per piece) by reading the
    inputs once more, up to the last passage. Each passage's text is checked against the digests of
    what was read (SourceMap.digests): where it differs (the file changed since), or where the places
    differ from the recorded ones, the passage is not quoted and its note says the file changed. A map
    without digests (a context saved before they were recorded) is quoted unchecked, and says so."""
    if text is None or not passages:
        return passages
    want = sorted(range(len(passages)), key=lambda i: passages[i].start)
    check = DigestCheck(smap, passages) if smap.digests is not None and smap.pos else None
    last = max(p.end for p in passages)
    if check is not None:
        last = max(last, check.end)  # the entries holding the passages' ends are checked whole
    span = max(p.end - p.start for p in passages) + 2 * WORD_REACH  # a passage, widened to whole words
    got: dict[int, tuple[str, str]] = {}
    moved = False
    try:
        for buf_start, buf, n_marks, line0 in _windows(text.pieces(), text, last, span, check):
            if text.marks[:n_marks] != smap.marks[:n_marks]:
                moved = True  # the places differ: the files changed
                break
            for i in want:
                p = passages[i]
                if i in got or not buf_start <= p.start or p.end > buf_start + len(buf):
                    continue
                got[i] = (_trim(_whole_words(buf, p.start - buf_start, p.end - buf_start)),
                          _line(smap, p, buf, buf_start, line0))
    except KvpotError:
        return passages
    out = []
    for i, p in enumerate(passages):
        if moved or (check is not None and not check.same(p)):
            # no quote of what is there now, and no line: a text input's recorded place is the line its piece
            # began on ("line 1" for most of a small file), which only the text read back would refine
            out.append(replace(p, note=CHANGED, where="" if p.where.startswith("line ") else p.where))
        elif i in got:
            out.append(Passage(p.source, got[i][1], p.start, p.end, p.share, got[i][0],
                               "" if check is not None else UNCHECKED))
        else:
            out.append(p)
    return out


class DigestCheck:
    """The text read back, entry by entry of the map, against the digests of the text that was read:
    `feed` takes the joined text in order, `same(passage)` says whether every entry the passage covers
    read back the same (an entry not reached, e.g. a file now shorter, is not the same)."""

    def __init__(self, smap: SourceMap, passages: list[Passage]):
        self.smap = smap
        # the entries the passages cover: the one holding each start up to the one holding its end
        self.need: set[int] = set()
        for p in passages:
            a = max(bisect_right(smap.char, p.start) - 1, 0)
            b = max(bisect_right(smap.char, max(p.end - 1, p.start)) - 1, a)
            self.need.update(range(a, b + 1))
        self.end = max((smap.entry_end(i) for i in self.need), default=0)
        self.ok: set[int] = set()
        self._parts: dict[int, list[str]] = {}
        self._seen = 0

    def feed(self, piece: str) -> None:
        start, self._seen = self._seen, self._seen + len(piece)
        for i in sorted(self.need - self.ok):
            a, b = self.smap.char[i], self.smap.entry_end(i)
            if b <= start or a >= self._seen:
                continue
            self._parts.setdefault(i, []).append(piece[max(a - start, 0):b - start])
            if b <= self._seen:
                if text_digest("".join(self._parts.pop(i))) == self.smap.digests[i]:
                    self.ok.add(i)
                else:
                    self.need.discard(i)

    def same(self, p: Passage) -> bool:
        a = max(bisect_right(self.smap.char, p.start) - 1, 0)
        b = max(bisect_right(self.smap.char, max(p.end - 1, p.start)) - 1, a)
        return all(i in self.ok for i in range(a, b + 1))


def _windows(pieces: Iterable[str], text: SourceSet, last: int, span: int,
             check: DigestCheck | None = None) -> Iterator[tuple[int, str, int, int]]:
    """(start, text, marks so far, where the line holding `start` begins) of each piece joined to the pieces
    before it that hold at least its `span` characters before it (or all of them, near the start), until
    the character `last` is passed. Every run of up to `span` characters up to `last` then lies whole in
    one window (the window of the piece holding its last character), however many pieces it crosses: short
    PDF pages or lines make passages that cross three or more. A line may begin pieces before the window
    (a one-line log): its start is carried along."""
    held: deque[tuple[str, int]] = deque()  # the pieces before the current one that the window keeps, with
    held_chars, seen, line = 0, 0, 0        # the line start at each; `line`: the line start at `seen`
    for piece in pieces:
        if check is not None:
            check.feed(piece)
        yield seen - held_chars, "".join(h for h, _ in held) + piece, len(text.marks), held[0][1] if held else line
        held.append((piece, line))
        nl = piece.rfind("\n")
        line = seen + nl + 1 if nl >= 0 else line
        seen += len(piece)
        if seen >= last:
            return
        held_chars += len(piece)
        while held and held_chars - len(held[0][0]) >= span:
            held_chars -= len(held.popleft()[0])


def line_place(line: int, col: int) -> str:
    """Where a passage starts in a text input: "line 40", with its column where it starts deep inside a long
    line ("line 3 col 52,118": a one-line log or minified file, whose passages would all read "line 3")."""
    return f"line {line:,} col {col:,}" if col > LONG_LINE else f"line {line:,}"


def _line(smap: SourceMap, p: Passage, buf: str, buf_start: int, line0: int) -> str:
    """A text input is marked per piece ("line N" where the piece starts): the passage's own line (`line0`:
    where the line holding buf's first character begins)."""
    mark = smap.where(p.start)
    if mark is None or not mark.where.startswith("line ") or mark.offset < buf_start:
        return p.where
    nl = buf.rfind("\n", 0, p.start - buf_start)
    begins = buf_start + nl + 1 if nl >= 0 else line0
    return line_place(int(mark.where[5:]) + buf.count("\n", mark.offset - buf_start, p.start - buf_start),
                      p.start - begins + 1)


def _whole_words(buf: str, a: int, b: int, reach: int = WORD_REACH) -> str:
    """buf[a:b] widened to the words it cuts (a passage starts and ends at token offsets)."""
    lo, hi = a, b
    while lo > max(a - reach, 0) and not buf[lo - 1].isspace():
        lo -= 1
    while hi < min(b + reach, len(buf)) and not buf[hi].isspace():
        hi += 1
    return buf[lo:hi]


def _trim(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= QUOTE_CHARS else words[:QUOTE_CHARS - 1].rsplit(" ", 1)[0] + "…"


def format_passages(found: list[dict]) -> str:
    """The text --sources prints after the answer."""
    if not found:
        return "\nsources: none (the answer attended to no document token the pot still holds)\n"
    lines = ["", "sources:"]
    for n, p in enumerate(found, 1):
        place = f"{p['source']} {p['where']}".strip()
        quote_text = f': "{p["quote"]}"' if p["quote"] else ""
        lines.append(f"  {n}. {place} ({p['share']:.0%}){quote_text}")
    for note, said in ((CHANGED, "{} changed since it was read: its passages are not quoted (the text there now is "
                                 "not what the model read)"),
                       (UNCHECKED, "{} is quoted as it reads now: this context records no digest of the text that "
                                   "was read, so whether it changed since could not be checked")):
        names = list(dict.fromkeys(p["source"] or "the input" for p in found if p.get("note") == note))
        if names:
            lines.append("  " + said.format(", ".join(names)))
    return "\n".join(lines) + "\n"
