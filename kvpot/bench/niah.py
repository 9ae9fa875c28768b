"""Needle-in-a-haystack cases, asked with a plain completion prompt. Tasks:

passkey:  InfiniPot table 4 / Locret's R.PassKey: a random 5-digit key in one repeated filler sentence
prose:    one access code in varied prose (kvpot.bench.haystack), phrased one of several ways
multikey: RULER's multi-key NIAH: four access codes for four places in that prose; the question names one
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

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
    tokens = model.tokenize(head + needle(key) + FILLER * (n_fill - at))
    return Haystack(tokens=tokens, key=key, depth=depth, needle_at=len(model.tokenize(head)))


TASKS = {"passkey": 0, "prose": 1, "multikey": 4}  # task -> needles in the prose (0: the passkey filler)


@dataclass(frozen=True)
class Case:
    """One haystack as the engine reads it: document tokens, what to append, what must come back."""

    tokens: list[int]
    key: str
    prompt: str            # appended after the document; the answer follows it
    question: str          # the catalyst question (CaP-Q)
    distractors: tuple[str, ...] = ()


def make_case(model, task: str, n_tokens: int, depth: float, seed: int) -> Case:
    if task not in TASKS:
        raise ValueError(f"unknown niah task {task!r}; known: {', '.join(TASKS)}")
    if task == "passkey":
        hay = make_haystack(model, n_tokens, depth, seed)
        return Case(hay.tokens, hay.key, ANSWER_PREFIX, QUESTION)
    from kvpot.bench.haystack import make_prose_haystack

    hay = make_prose_haystack(lambda t: len(model.tokenize(t)), n_tokens, depth, seed, n_keys=TASKS[task])
    return Case(model.tokenize(hay.text), hay.key, hay.answer_prefix, hay.question,
                tuple(n.key for n in hay.needles[1:]))


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


def read_and_ask(engine, policy_spec: str, model_name: str, n_tokens: int, depth: float, seed: int,
             task: str = "passkey") -> CaseResult:
    """Read one haystack with the engine (reset first) and ask for the key."""
    engine.reset()
    case = make_case(engine.model, task, n_tokens, depth, seed)
    engine.set_question(case.question)
    peak = [0]
    t0 = time.perf_counter()
    engine.feed(case.tokens, on_chunk=lambda ev: peak.__setitem__(0, max(peak[0], ev.stats.bytes_used)))
    read = time.perf_counter() - t0
    answer = "".join(engine.answer(case.prompt, max_tokens=8))
    return CaseResult(model=model_name, policy=policy_spec, length=n_tokens, tokens=engine.tokens_seen, depth=depth, seed=seed,
                      key=case.key, answer=answer.strip(), correct=case.key in answer, tok_s=engine.tokens_seen / read,
                      read_seconds=read, distill_seconds=engine.compact_seconds, peak_pot_bytes=peak[0],
                      compactions=engine.n_compactions, task=task,
                      distractor=any(k in answer for k in case.distractors))
