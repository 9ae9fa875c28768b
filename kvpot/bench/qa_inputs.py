"""Long inputs for `kvpot bench qa`: excerpts around the asked questions' passages, joined with other
documents (distractors) and multi-key needles to about N tokens, each passage at a seeded depth.

Several questions share one input (more as inputs grow), so an input is read once and its questions
asked in turn: on 2 cores reading is the cost, asking is cheap. Each input also carries RULER's
multi-key needles (four access codes for four places, kvpot.bench.haystack; the question names one),
asked like the other questions. Everything is drawn from the seed: the same seed on the same machine
(the same files, the same Python) gives the same inputs."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvpot.bench.haystack import draw_needles
from kvpot.bench.haystack import question as needle_question
from kvpot.bench.qa_questions import Question
from kvpot.bench.qa_sources import STDLIB, find_passage, read_source

SEP = "\n\n"
CHUNK_CHARS = 2400      # a distractor piece: a few hundred tokens, so a passage lands near its depth
EXCERPT_SIDE = 1500     # characters of the source kept on each side of a passage (fewer in short inputs)
# more texts to draw distractors from, beside the question set's own sources
EXTRA_SOURCES = tuple(STDLIB + "/" + f for f in (
    "difflib.py", "inspect.py", "typing.py", "subprocess.py", "zipfile.py", "calendar.py", "datetime.py",
    "decimal.py", "_pydecimal.py", "email/message.py", "mailbox.py", "pathlib.py", "shutil.py", "string.py",
    "threading.py", "unittest/case.py", "urllib/parse.py", "collections/__init__.py", "statistics.py"))


def doc_tokens(length: int) -> int:
    """Tokens of document in an input of nominal `length`: the rest is room for the chat template, the
    question and the answer, so "32K" fits a 32,768-token window with full attention."""
    return length - min(512, length // 8)


def per_input(length: int) -> int:
    """Questions that share one input: about one per 2,700 tokens (3 at 8K, 12 at 32K)."""
    return max(1, round(length / 2730))


def display_name(source: str) -> str:
    """The header an excerpt carries: the path, the stdlib as CPython's Lib/ (the same on every install)."""
    return source.replace(STDLIB, "Lib")


@dataclass(frozen=True)
class Ask:
    """One question asked of a joined input."""

    id: str
    task: str                  # "qa" or "multikey"
    question: str
    refs: tuple[str, ...]      # the answer and its aliases
    heldout: bool
    target_depth: float
    depth: float               # where the passage (or needle) starts, as a share of the input's tokens
    distractors: tuple[str, ...] = ()  # multikey: the other needles' keys
    kind: str = "multikey"     # a question's kind in the set (qa_questions: lexical, paraphrase, ...)


@dataclass(frozen=True)
class JoinedInput:
    index: int
    text: str
    tokens: int                # counted piece by piece (the reader's count may differ by a few)
    asks: tuple[Ask, ...]


@dataclass
class _Piece:
    text: str
    tokens: int
    anchor: int = 0            # tokens before the passage within the piece
    ask: Ask | None = None
    target: float = 0.0


def _span(text: str, start: int, end: int, side: int) -> tuple[int, int]:
    """Up to `side` characters of the text on each side of [start, end), cut at line ends."""
    lo = max(0, start - side)
    if lo > 0:
        nl = text.find("\n", lo, start)
        lo = nl + 1 if nl >= 0 else lo
    hi = min(len(text), end + side)
    nl = text.rfind("\n", end, hi)
    hi = nl if nl >= 0 and hi < len(text) else hi
    return lo, hi


def excerpt(q: Question, side: int) -> tuple[str, int]:
    """The question's passages, each with up to `side` characters of its source on each side, cut at line
    ends, under the source's header; returns (text, characters before the first passage). Passages whose
    excerpts meet share one; apart, they are joined in the source's order by a line "[...]", so a
    two-passage question's input holds both."""
    text = read_source(q.source)
    found = [find_passage(text, p) for p in q.passages]
    spans = sorted(_span(text, s, e, side) for s, e in found)
    merged = [list(spans[0])]
    for lo, hi in spans[1:]:
        if lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    head = f"===== {display_name(q.source)} =====\n\n"
    out, before = head, 0
    first = found[0][0]
    for k, (lo, hi) in enumerate(merged):
        piece = text[lo:hi]
        strip = len(piece) - len(piece.lstrip("\n"))
        if k:
            out += "\n[...]\n"
        if lo <= first < hi:
            before = len(out) + first - lo - strip
        out += piece.strip("\n")
    return out, before


def distractor_chunks(sources: list[str], rng: random.Random) -> list[str]:
    """Pieces of the given sources (the files this machine has), each under its source's header, shuffled."""
    out = []
    for src in sources:
        text = read_source(src)
        if not text:
            continue
        at = 0
        while at < len(text):
            end = min(len(text), at + CHUNK_CHARS)
            nl = text.rfind("\n", at + CHUNK_CHARS // 2, end)
            end = nl + 1 if nl >= 0 and end < len(text) else end
            body = text[at:end].strip("\n")
            if body.strip():
                out.append(f"===== {display_name(src)} =====\n\n{body}")
            at = end
    rng.shuffle(out)
    return out


def build_inputs(questions: list[Question], count_tokens: Callable[[str], int], length: int, seed: int,
                 group: int | None = None, multikey: bool = True) -> list[JoinedInput]:
    """Inputs of about doc_tokens(length) tokens asking every question once, `group` per input. Questions
    about a whole document are left out: whole_inputs builds theirs."""
    rng = random.Random(f"qa-{seed}-{length}")
    order = [q for q in questions if not q.whole_input]
    if not order:
        return []
    rng.shuffle(order)
    n_inputs = -(-len(order) // (group or per_input(length)))
    # dealt out by source, so questions on one file go to different inputs where there are enough of
    # them: two excerpts of one file in one input would overlap, and one could answer the other's question
    order.sort(key=lambda q: q.source)
    groups = [order[i::n_inputs] for i in range(n_inputs)]
    pool = sorted({q.source for q in questions} | set(EXTRA_SOURCES))
    return [_join(g, count_tokens, doc_tokens(length), pool, seed, length, i, multikey) for i, g in enumerate(groups)]


def _join(group: list[Question], count: Callable[[str], int], target: int, pool: list[str], seed: int, length: int,
          index: int, multikey: bool) -> JoinedInput:
    rng = random.Random(f"qa-{seed}-{length}-{index}")
    tok = lambda text: count(text + SEP)  # noqa: E731
    # excerpts take at most about two thirds of the input (at ~3.5 characters a token)
    side = int(min(EXCERPT_SIDE, max(100, target * 3.5 * 2 / 3 / len(group) / 2)))
    # stratified depths: one question per slot of the input, at a random place in it
    slots = list(range(len(group)))
    rng.shuffle(slots)
    inserts: list[_Piece] = []
    for q, slot in zip(group, slots):
        text, before = excerpt(q, side)
        d = round((slot + rng.uniform(0.05, 0.95)) / len(group), 3)
        inserts.append(_Piece(text, tok(text), count(text[:before]), target=d,
                              ask=Ask(q.id, "qa", q.question, tuple(q.refs), q.heldout, d, 0.0, kind=q.kind)))
    if multikey:
        d = round(rng.uniform(0.05, 0.95), 3)
        needles = draw_needles(seed * 100_003 + length + index, d, 4)
        asked = needles[0]
        inserts.append(_Piece(asked.text, tok(asked.text), target=d, ask=Ask(
            f"multikey-{index}", "multikey", needle_question(asked.place), (asked.key,), False, d, 0.0,
            tuple(n.key for n in needles[1:]))))
        inserts += [_Piece(n.text, tok(n.text), target=n.depth) for n in needles[1:]]
    used = {q.source for q in group}  # no second copy of an asked file: it could answer from elsewhere
    filler: list[_Piece] = []
    room = target - sum(p.tokens for p in inserts)
    for text in distractor_chunks([s for s in pool if s not in used], rng):
        if room <= 0:
            break
        # another file saying the same (GPL-2's address is LGPL-2.1's): only the excerpt answers
        if any(find_passage(text, p) for q in group for p in q.passages):
            continue
        n = tok(text)
        if n > room:  # the last piece: cut to fit (at a line end) so the input stays near its length
            text = text[: max(1, int(len(text) * room / n))].rsplit("\n", 1)[0]
            n = tok(text)
        filler.append(_Piece(text, n))
        room -= n
    total = sum(p.tokens for p in filler) + sum(p.tokens for p in inserts)
    pieces = _place(filler, inserts, total)
    asks, at = [], 0
    for p in pieces:
        if p.ask is not None:
            a = p.ask
            asks.append(Ask(a.id, a.task, a.question, a.refs, a.heldout, a.target_depth,
                            round((at + p.anchor) / max(1, total), 4), a.distractors, a.kind))
        at += p.tokens
    return JoinedInput(index, SEP.join(p.text for p in pieces) + "\n", total, tuple(asks))


def whole_inputs(questions: list[Question], count_tokens: Callable[[str], int]) -> list[JoinedInput]:
    """The inputs of the questions about a whole document: each such source alone and whole, under its
    header, asked all of its whole-document questions (no distractors, no multi-key needle; its length is
    the document's own, whatever length the grid reads). Depth 0: the question is about all of it."""
    by_source: dict[str, list[Question]] = {}
    for q in questions:
        if q.whole_input:
            by_source.setdefault(q.source, []).append(q)
    out = []
    for i, (src, qs) in enumerate(by_source.items()):
        text = f"===== {display_name(src)} =====\n\n{read_source(src).strip(chr(10))}\n"
        out.append(JoinedInput(i, text, count_tokens(text), tuple(
            Ask(q.id, "qa", q.question, tuple(q.refs), q.heldout, 0.0, 0.0, kind=q.kind) for q in qs)))
    return out


def _place(filler: list[_Piece], inserts: list[_Piece], total: int) -> list[_Piece]:
    """Put each insert, shallowest first, at the filler boundary that brings its anchor nearest its depth."""
    slots: list[list[_Piece]] = [[] for _ in range(len(filler) + 1)]  # inserts before filler[b]
    starts = [0]
    for p in filler:
        starts.append(starts[-1] + p.tokens)
    shift, lowest = 0, 0  # tokens of inserts placed so far (all before any later boundary), the boundary reached
    for p in sorted(inserts, key=lambda p: p.target):
        want = p.target * total - p.anchor
        b = min(range(lowest, len(filler) + 1), key=lambda b: abs(starts[b] + shift - want))
        slots[b].append(p)
        shift += p.tokens
        lowest = b
    out: list[_Piece] = []
    for b, group in enumerate(slots):
        out += group
        if b < len(filler):
            out.append(filler[b])
    return out
