"""The focused read of `kvpot ask` past what the pot holds: the passages the pot's answer drew on, read
again with full attention, and that reading answers.

Why: past the window a pot holds a few thousand cells of ~100K tokens, and a fact in the middle survives
only if every distillation keeps it; on the 1.5B model most do not ("What 15 distillations leave of a code",
docs/benchmarks.md). Where the question's passage lies survives far better than the fact itself: the
attention an answer from the pot pays to the document (the ranking `--sources` shows) names the passage
even when the answer is wrong. So `ask` reads in two steps. The pot, read with the question first, answers
once without showing it (`locate`: up to LOCATING_TOKENS tokens, greedy, with that attention summed by
stream position); the PASSAGES passages it drew on most are widened by REACH_CHARS characters each side
to whole lines, joined in the document's order, and read in a new session with full attention (stock
llama.cpp's computation over a few thousand tokens); the answer comes from that reading.

The passages' text is read again from the inputs (`FocusText`), checked to be the text that was read
(its places are the ones recorded), so a focused read needs inputs that can be read again: files, not a
pipe; a reopened context's files are found again by name, as `--sources` finds them for quotes. Each
passage after the first is headed with its file and line (the first follows the prompt's opening: see
`_head`), and `--sources` of the focused answer names places and offsets of the original inputs.

This is not one of the published methods: it composes kvpot's pot (any policy that leaves cells out, as
the locator) with stock full attention (as the reader), and is measured as such (docs/benchmarks.md,
"The focused read").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from kvpot.errors import KvpotError
from kvpot.ingest.sources import Mark, Source, SourceSet
from kvpot.locator.sources import LONG_LINE, DigestCheck, SourceMap, line_place, passages_in, reread
from kvpot.session.checks import QUESTION_ROOM, answer_reserve
from kvpot.session.reading_plan import TokenCount, plan_reading
from kvpot.session.settings import AUTO, reads_in_full

PASSAGES = 8            # passages the locating answer drew on most
REACH_CHARS = 1200      # characters each passage is widened by on each side (about 300 tokens)
LINE_REACH = LONG_LINE  # at most this much further, to end a window at a line's end (a window not widened
                        # to its line's start begins deeper in it than that: its place says its column)
LOCATING_TOKENS = 48    # the locating answer's length: a short factual answer fits


@dataclass(frozen=True)
class Window:
    """One stretch of the joined input to read again: characters [start, end) of the joined text."""
    start: int
    end: int
    source: str = ""     # the file it starts in
    where: str = ""      # "line 1,204", "p. 12"
    text: str = ""


def ranked_spans(mass: dict[int, float], smap: SourceMap, sinks: int, passages: int = PASSAGES,
                 reach: int = REACH_CHARS) -> list[tuple[int, int, float]]:
    """Character spans [start, end) of the joined text around the `passages` passages with the most mass,
    best first (the passages `--sources` would name: kvpot.locator.sources.passages_in), each widened by
    `reach` characters each side, with its share of the mass."""
    return [(max(0, p.start - reach), min(smap.end_char, p.end + reach), p.share)
            for p in passages_in(mass, smap, sinks, passages)]


def spans(mass: dict[int, float], smap: SourceMap, sinks: int, passages: int = PASSAGES,
          reach: int = REACH_CHARS) -> list[tuple[int, int]]:
    """The ranked spans (`ranked_spans`), overlaps merged, in the document's order."""
    out = [(lo, hi) for lo, hi, _ in ranked_spans(mass, smap, sinks, passages, reach)]
    out.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in out:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def windows(text: SourceSet, smap: SourceMap, wanted: list[tuple[int, int]]) -> list[Window]:
    """The text of each span, read again from the inputs and widened to whole lines (by up to LINE_REACH
    characters each side), with the file and place it starts at. Refused when the inputs read now are not
    the text that was read (a file changed: its places differ from the recorded ones)."""
    if not wanted:
        return []
    last = max(hi for _, hi in wanted) + LINE_REACH  # spans in any order (a ranking's)
    got: list[list[str]] = [[] for _ in wanted]
    firsts: list[tuple[int, str, str] | None] = [None] * len(wanted)  # (piece start, piece, its mark) of each start
    # where the line holding each span's start begins: it may begin pieces earlier (files after the first are
    # headed by a line of their own, so no line runs from one file into the next)
    line_at = [0] * len(wanted)
    # the text read back must be the text that was read, entry by entry of the map (a file rewritten at the
    # same length keeps its places): checked against the map's digests where it has them
    spans_read = [SimpleNamespace(start=max(lo - LINE_REACH, 0), end=hi + LINE_REACH) for lo, hi in wanted]  # widened
    check = DigestCheck(smap, spans_read) if smap.digests is not None and smap.pos else None
    last = max(last, check.end) if check is not None else last
    seen, line_start = 0, 0
    for piece in text.pieces():
        if check is not None:
            check.feed(piece)
        end = seen + len(piece)
        for i, (lo, hi) in enumerate(wanted):
            a, b = max(lo - LINE_REACH, seen), min(hi + LINE_REACH, end)
            if a < b:
                got[i].append(piece[a - seen:b - seen])
            if firsts[i] is None and seen <= lo < end:
                firsts[i] = (seen, piece, text.marks[-1].where if text.marks else "")
                nl = piece.rfind("\n", 0, lo - seen)
                line_at[i] = seen + nl + 1 if nl >= 0 else line_start
        nl = piece.rfind("\n")
        line_start = seen + nl + 1 if nl >= 0 else line_start
        seen = end
        if seen >= last:
            break
    n = len(text.marks)
    if text.marks[:n] != smap.marks[:n] or any(f is None for f in firsts):
        raise KvpotError("the inputs changed since they were read: the passages cannot be read again")
    bad = [sp for sp in spans_read if not check.same(sp)] if check is not None else []
    if bad:
        names = sorted({m.source for m in (smap.where(sp.start) for sp in bad) if m is not None})
        raise KvpotError(f"{', '.join(names) or 'an input'} changed since it was read (its text differs from what "
                         "the model read): the passages cannot be read again")
    out = []
    for (lo, hi), parts, first, line0 in zip(wanted, got, firsts, line_at):
        buf = "".join(parts)
        base = max(lo - LINE_REACH, 0)
        a, b = lo - base, min(hi - base, len(buf))
        nl = buf.rfind("\n", 0, a)
        a = nl + 1 if nl >= 0 and a - nl <= LINE_REACH else a
        nl = buf.find("\n", b)
        b = nl if 0 <= nl and nl - b <= LINE_REACH else b
        start = base + a
        mark = smap.where(start)
        out.append(Window(start, base + b, mark.source if mark else "", _where(mark, first, start, line0), buf[a:b]))
    return out


def _where(mark: Mark | None, first: tuple[int, str, str], start: int, line_start: int) -> str:
    """The place a window starts: the line itself for text inputs (marked per piece, "line N" where the
    piece starts; with its column where the window starts deep inside a long line: `line_place`), else the
    piece's own mark (a page, a chapter)."""
    piece_start, piece, where = first
    if mark is None:
        return ""
    if where.startswith("line ") and mark.offset <= piece_start:
        return line_place(int(where[5:]) + piece.count("\n", 0, max(0, start - piece_start)), start - line_start + 1)
    return mark.where


def heading(w: Window) -> str:
    """What each passage of a focused read is headed with: where in the inputs it comes from."""
    place = ", ".join(x for x in (w.source, w.where) if x)
    return f"\n\n===== {place or 'passage'} =====\n\n"


def _head(wins: list[Window], i: int) -> str:
    """Passage i's heading. The first passage has none: the model's attention gathers on the first tokens it
    reads (StreamingLLM's sinks), and after a heading those are the passage's first words, which `--sources`
    would then name whatever the answer says."""
    return heading(wins[i]) if i else ""


@dataclass
class FocusText(SourceSet):
    """The windows as one input: each headed with its place, marked with the original file and place
    (so `--sources` of the focused answer names the inputs' places), and read again the same way for
    quotes."""
    windows: list[Window] = field(default_factory=list)
    ranked: int = 0  # the passages of the ranking whose spans the windows hold (focus_for: fewer where they did not fit)
    counted: TokenCount | None = None  # its tokens as focus_settings' plan counted them (the focused read's exact total)

    @classmethod
    def of(cls, wins: list[Window], names: list[str]) -> FocusText:
        total = sum(len((_head(wins, i) + w.text).encode("utf-8")) for i, w in enumerate(wins))
        # no count in the name: the focus line counts the passages located, which overlapping ones joined
        # into fewer windows would contradict
        src = Source(name=f"passages of {', '.join(names)}", path=None,
                     size=total, complete=True)
        return cls(sources=[src], windows=list(wins))

    def can_read_again(self) -> bool:
        return True

    def counter(self) -> FocusText:
        return FocusText(sources=list(self.sources), warn=self.warn, warnings=self.warnings, windows=self.windows,
                         ranked=self.ranked, counted=self.counted)

    def in_heading(self, offset: int) -> bool:
        """Whether `offset` of this text falls in a passage's heading (a place, not the inputs' text)."""
        at = 0
        for i, w in enumerate(self.windows):
            head = _head(self.windows, i)
            if offset < at + len(head):
                return offset >= at
            at += len(head) + len(w.text)
        return False

    def stretches(self) -> list[tuple[int, int]]:
        """Characters [start, end) of this text that each passage's text takes (between the headings): each is
        a stretch of one input, apart from the others (kvpot.locator.sources.file_chars)."""
        out, at = [], 0
        for i, w in enumerate(self.windows):
            at += len(_head(self.windows, i))
            out.append((at, at + len(w.text)))
            at += len(w.text)
        return out

    def input_offset(self, offset: int) -> int:
        """The character of the inputs' joined text at `offset` of this text (a heading: its passage's start)."""
        at = 0
        for i, w in enumerate(self.windows):
            at += len(_head(self.windows, i))
            if offset < at + len(w.text) or w is self.windows[-1]:
                return w.start + min(max(offset - at, 0), len(w.text))
            at += len(w.text)
        return 0

    def pieces(self, piece_bytes: int = 0, stdin=None) -> Iterator[str]:
        self.marks, self.chars = [], 0
        for i, w in enumerate(self.windows):
            head = _head(self.windows, i)
            if head:
                self.chars += len(head)
                self.bytes_read += len(head.encode("utf-8"))
                yield head
            self.marks.append(Mark(self.chars, w.source, w.where))
            self.chars += len(w.text)
            self.bytes_read += len(w.text.encode("utf-8"))
            yield w.text


# why a focused read does not apply, for stderr (None: it does)
NOTHING_LEFT_OUT = "nothing of the input was left out of memory"
READ_IN_FULL = "the input was read with full attention"
READ_ONCE = "the input cannot be read again (stdin, a pipe, or a file no longer there)"


def why_not(session) -> str | None:
    """None when the session's reading left part of the input out and its inputs can be read again (a
    focused read can then add what the pot lost); else why not."""
    if reads_in_full(session.policy_spec):
        return READ_IN_FULL
    if session.engine.stats().n_compactions == 0:
        return NOTHING_LEFT_OUT
    if reread(session) is None:
        return READ_ONCE
    return None


@dataclass(frozen=True)
class Located:
    """The locating answer and the attention it paid to each stream position (Engine.answer_mass)."""
    answer: str
    mass: dict[int, float]
    question_tokens: int    # the question as the answering turn puts it (its chat template's tokens too)
    stopped: bool = False   # stop() ended it before its end
    locator: str = "pot"    # which locator found the mass (kvpot.session.locating)


def locate(session, question: str, tokens: int = LOCATING_TOKENS, stop=lambda: False) -> Located:
    """The locating answer: `question` answered from the pot (greedy, not shown), with the attention its
    rows paid to the document. The exchange stays in the session's pot. `stop()` true ends it early."""
    eng = session.engine
    asked = len(session._tokens(session.format.first_question(question)))
    eng.track_answer_attention(True)
    try:
        said = []
        for piece in session.ask(question, max_tokens=tokens):
            said.append(piece)
            if stop():
                return Located("".join(said).strip(), dict(eng.answer_mass or {}), asked, stopped=True)
        return Located("".join(said).strip(), dict(eng.answer_mass or {}), asked)
    finally:
        eng.track_answer_attention(False)


def focus_for(session, located: Located, passages: int = PASSAGES):
    """(the focused read's input, its settings): the passages `located` drew on most, read again from the
    session's inputs (why_not() is None), and full attention sized to them. Where that cannot fit the device
    or the model's window, fewer passages (halved until one); the last refusal is raised."""
    facts = session.facts
    eng = session.engine
    k, last = passages, None
    while k >= 1:
        wanted = spans(located.mass, session.source_map, eng.policy.sink_tokens(), k)
        if not wanted:
            raise KvpotError("the answer from memory drew on no passage of the input")
        again = reread(session)
        if again is None:
            raise KvpotError(READ_ONCE)
        text = FocusText.of(windows(again, session.source_map, wanted), [s["name"] for s in session.sources])
        text.ranked = k
        try:
            return text, focus_settings(session.settings, facts, text, located.question_tokens)
        except KvpotError as e:
            last, k = e, k // 2
    raise last


def focus_settings(settings, facts, text: FocusText, question_tokens: int = 0):
    """The settings of the focused read: full attention over `text`, its context sized to it and to the
    question (refused, as `--policy full` is, where it cannot fit the device or the model's window)."""
    full = replace(settings, policy="full", budget=AUTO, question_before="off", flash_attn="auto")
    # a question longer than the reserve's room for one is held whole too: full attention drops nothing
    # (the session's context is its budget and the usual reserve: the budget takes the rest)
    extra = max(0, question_tokens - QUESTION_ROOM)
    plan = plan_reading(full, facts, text, policy_chosen=True, reserve=answer_reserve(full) + extra)
    text.counted = plan.counted
    return replace(plan.settings, budget=plan.settings.budget + extra)
