"""Needle-in-a-haystack cases, asked with a plain completion prompt. Tasks:

passkey:  InfiniPot table 4 / Locret's R.PassKey: a random 5-digit key in one repeated filler sentence
prose:    one access code in varied prose (kvpot.bench.haystack), phrased one of several ways
multikey: RULER's multi-key NIAH: four access codes for four places in that prose; the question names one

With `sources`, a case also records whether the passage `kvpot ask --sources` would show first is the
needle's (the answer's attention over the kept cells, ranked as kvpot.locator.sources ranks it).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass

from kvpot.bench.read_lines import reading_line

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "\n\nWhat is the pass key? The pass key is"


def needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


@dataclass(frozen=True)
class Haystack:
    tokens: list[int]      # the document (intro + filler with the needle), without BOS
    key: str
    depth: float
    needle_at: int         # token index where the needle starts
    text: str = ""         # the document's text
    needle_chars: tuple[int, int] = (0, 0)  # the needle's characters in text, [start, end)


def make_haystack(model, n_tokens: int, depth: float, seed: int) -> Haystack:
    """About n_tokens of document; the needle sits after `depth` of the filler, at a sentence boundary.

    The text is tokenized whole: tokenizing the pieces separately splits "again. The" into other
    tokens than the model ever saw, and Gemma-3-270M then fails even with full attention."""
    key = str(random.Random(seed).randint(10000, 99999))
    per_filler = len(model.tokenize(FILLER * 16)) / 16
    fixed = len(model.tokenize(INTRO + needle(key)))
    n_fill = max(1, int((n_tokens - fixed) / per_filler))
    at = int(round(depth * n_fill))
    head = INTRO + FILLER * at
    text = head + needle(key) + FILLER * (n_fill - at)
    tokens, chars = model.tokenize(text), (len(head), len(head) + len(needle(key).rstrip()))
    # the needle's first token is the one that spells its first character: " The" where the space ending
    # `head` joins it (len(model.tokenize(head)) counts that space as a token of its own: one too many)
    return Haystack(tokens=tokens, key=key, depth=depth, needle_at=needle_tokens(model.piece, tokens, text, chars)[0],
                    text=text, needle_chars=chars)


TASKS = {"passkey": 0, "prose": 1, "multikey": 4}  # task -> needles in the prose (0: the passkey filler)


@dataclass(frozen=True)
class Case:
    """One haystack as the engine reads it: document tokens, what to append, what must come back."""

    tokens: list[int]
    key: str
    prompt: str            # appended after the document; the answer follows it
    question: str          # the catalyst question (CaP-Q)
    distractors: tuple[str, ...] = ()
    text: str = ""         # the document's text, and the asked needle's characters in it [start, end)
    needle_chars: tuple[int, int] = (0, 0)


def make_case(model, task: str, n_tokens: int, depth: float, seed: int) -> Case:
    if task not in TASKS:
        raise ValueError(f"unknown niah task {task!r}; known: {', '.join(TASKS)}")
    if task == "passkey":
        hay = make_haystack(model, n_tokens, depth, seed)
        return Case(hay.tokens, hay.key, ANSWER_PREFIX, QUESTION, text=hay.text, needle_chars=hay.needle_chars)
    from kvpot.bench.haystack import make_prose_haystack

    hay = make_prose_haystack(lambda t: len(model.tokenize(t)), n_tokens, depth, seed, n_keys=TASKS[task])
    at = hay.text.index(hay.needles[0].text)
    return Case(model.tokenize(hay.text), hay.key, hay.answer_prefix, hay.question,
                tuple(n.key for n in hay.needles[1:]), text=hay.text, needle_chars=(at, at + len(hay.needles[0].text)))


def needle_tokens(piece, tokens: list[int], text: str, chars: tuple[int, int]) -> tuple[int, int]:
    """[first, last + 1) of the tokens (indices into `tokens`, the tokenized `text`) that spell any of
    text[chars[0]:chars[1]], found by the tokens' pieces (`piece(token) -> bytes`) laid end to end. A
    SentencePiece vocabulary that adds a leading space the text did not have gives more bytes than the
    text: the surplus is the first token's."""
    a, b = (len(text[:c].encode("utf-8")) for c in chars)
    sizes = [len(piece(t)) for t in tokens]
    first = last = None
    at = -max(0, sum(sizes) - len(text.encode("utf-8")))
    for i, size in enumerate(sizes):
        end = at + size
        if at < b and a < end:
            first = i if first is None else first
            last = i
        elif at >= b:
            break
        at = end
    if first is None:
        raise ValueError(f"no token spells characters {chars[0]}..{chars[1]} of the document")
    return first, last + 1


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the half-open ranges [a0, a1) and [b0, b1) share a position."""
    return a[0] < b[1] and b[0] < a[1]


SOURCE_RANKS = 10  # passages ranked for source_rank (--sources shows the first TOP of the same ranking)


def source_check(engine, case: Case, doc_first: int) -> tuple[bool, int | None, list[int]]:
    """(top passage overlaps the needle, 1-based rank of the first passage that does or None, the
    needle's stream positions [first, end)) for the answer just tracked (engine.answer_mass), the
    document's tokens at stream positions doc_first.. . Passages are ranked as `kvpot ask --sources`
    ranks them (same passages, same sinks: the policy's sink_tokens())."""
    from kvpot.locator.sources import rank_between

    t0, t1 = needle_tokens(engine.model.piece, case.tokens, case.text, case.needle_chars)
    span = (doc_first + t0, doc_first + t1)
    ranked = rank_between(engine.answer_mass or {}, doc_first, doc_first + len(case.tokens), SOURCE_RANKS,
                          engine.policy.sink_tokens())
    hits = [i for i, (p0, p1, _) in enumerate(ranked, 1) if overlaps((p0, p1), span)]
    return bool(hits) and hits[0] == 1, hits[0] if hits else None, list(span)


@dataclass
class CaseResult:
    model: str
    policy: str
    length: int            # requested haystack length
    tokens: int            # tokens actually read (with BOS)
    depth: float
    seed: int
    key: str
    answer: str
    correct: bool
    tok_s: float
    read_seconds: float
    distill_seconds: float
    peak_pot_bytes: int
    compactions: int
    task: str = "passkey"
    distractor: bool = False   # the answer gave another needle's key (multikey)
    nearer: str | None = None  # multikey: whose code the answer's number is closest to (nearest_code)
    # with --sources (None without): the top passage of the answer's sources is the needle's; the rank of
    # the first of the SOURCE_RANKS passages that is (None: none is); the needle's stream positions
    source_hit: bool | None = None
    source_rank: int | None = None
    needle_span: list[int] | None = None


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions that turn a into b."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (ca != cb))
    return row[-1]


def first_number(answer: str) -> str:
    """The answer's first run of digits ("" when it has none): the code it gives."""
    m = re.search(r"\d+", answer)
    return m.group(0) if m else ""


def nearest_code(answer: str, key: str, distractors) -> str | None:
    """Whose code the answer's first number is closest to by edit distance: "key", "distractor", or None
    (no number, or a tie). A miss such as "85321" for the key 32518 then reads as what it is, the code
    85322 of another place with one digit changed, not the key's digits out of order."""
    number = first_number(answer)
    if not number:
        return None
    to_key = edit_distance(number, key)
    to_other = min(edit_distance(number, d) for d in distractors)
    return None if to_key == to_other else "key" if to_key < to_other else "distractor"


def read_and_ask(engine, policy_spec: str, model_name: str, n_tokens: int, depth: float, seed: int,
             task: str = "passkey", sources: bool = False, on_read=lambda m: None) -> CaseResult:
    """Read one haystack with the engine (reset first) and ask for the key; with `sources`, also where
    the answer's attention went (source_check). `on_read` hears how far the read is after every chunk."""
    engine.reset()
    case = make_case(engine.model, task, n_tokens, depth, seed)
    engine.set_question(case.question)
    peak = [0]
    t0 = time.perf_counter()
    what = f"{policy_spec} {n_tokens:,} @ {depth}, seed {seed}"

    def on_chunk(ev) -> None:
        peak[0] = max(peak[0], ev.stats.bytes_used)
        on_read(reading_line(what, ev.tokens_read, len(case.tokens), time.perf_counter() - t0, engine.n_compactions))
    engine.feed(case.tokens, on_chunk=on_chunk)
    read = time.perf_counter() - t0
    doc_first = engine.tokens_seen - len(case.tokens)  # past the BOS feed added
    engine.track_answer_attention(sources)
    try:
        answer = "".join(engine.answer(case.prompt, max_tokens=8))
        hit, rank, span = source_check(engine, case, doc_first) if sources else (None, None, None)
    finally:
        engine.track_answer_attention(False)
    return CaseResult(model=model_name, policy=policy_spec, length=n_tokens, tokens=engine.tokens_seen, depth=depth, seed=seed,
                      key=case.key, answer=answer.strip(), correct=case.key in answer, tok_s=engine.tokens_seen / read,
                      read_seconds=read, distill_seconds=engine.compact_seconds, peak_pot_bytes=peak[0],
                      compactions=engine.n_compactions, task=task,
                      distractor=any(k in answer for k in case.distractors),
                      nearer=nearest_code(answer, case.key, case.distractors) if case.distractors else None,
                      source_hit=hit, source_rank=rank, needle_span=span)
