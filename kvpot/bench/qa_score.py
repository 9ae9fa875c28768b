"""Scoring for `kvpot bench qa`.

`strict` (what `correct` holds): an answer is right when it gives the reference (or an accepted alias) as
whole words and names no competing answer: none of the question's candidates (answers of the same type the
source holds: the other dates, versions, names; a multi-key needle's other codes) and no number of the shape
of a number the reference or its passage holds (another version, date, port, count, bug id) that is not in
the reference, its passage or the question. A list of candidates is then wrong, and so is a wrong address
around the right street name. A question whose answer the input does not hold (`absent`) is right when the
answer says so and names no candidate.

`contains` is the older, looser check (the reference appears as whole words), kept for the old-vs-strict
report of `kvpot bench qa-rescore`; `exact` is the answer that is the reference and nothing else."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_PUNCT = re.compile(r"[^\w]+")
# a number as a whole token: digits, dotted parts kept together ("2.0.9"), never inside a word ("POP3_PORT")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)*(?!\w)")
# spelled numbers a reference or an answer uses ("three years", "fifty percent"); "one" is left out, since
# it is more often a pronoun ("one or more lines") than a count
_WORDS = {w: str(i) for i, w in enumerate(
    "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split()) if w != "_"}
_WORDS |= {w: str(10 * i) for i, w in enumerate("thirty forty fifty sixty seventy eighty ninety".split(), 3)}
_SPELLED = re.compile(r"\b(" + "|".join(_WORDS) + r")\b")


def normalize(text: str) -> str:
    """Lower case, accents kept, every run of punctuation or whitespace one space ("2.0.9" -> "2 0 9")."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_PUNCT.sub(" ", text).replace("_", " ").split())


def _decline_phrases() -> tuple[str, ...]:
    """What an answer says when the input does not give what was asked, normalized as answers are: every
    negation with every verb of giving or finding (also passive: "cannot be determined"), and the phrases that
    need no verb. The prompt asks for "The document does not say." (kvpot.session.prompting.GROUNDING); models
    say it their own ways too ("is not mentioned", "no information", "not specified", "I couldn't find")."""
    negations = ("does not", "doesn't", "do not", "don't", "did not", "didn't", "cannot", "can not", "can't",
                 "could not", "couldn't", "is not", "isn't", "are not", "aren't", "was not", "wasn't", "were not",
                 "weren't", "has not", "hasn't", "have not", "haven't", "not", "never", "unable to", "not able to")
    verbs = ("mention", "mentioned", "specify", "specified", "state", "stated", "say", "said", "give", "given",
             "provide", "provided", "contain", "contained", "include", "included", "list", "listed", "find", "found",
             "define", "defined", "determine", "determined", "know", "known", "available", "clear", "have",
             "answer", "tell", "identify", "identified", "locate", "located", "see", "seen", "appear", "exist",
             "show", "shown", "indicate", "indicated", "reference", "referenced", "record", "recorded",
             "document", "documented", "present", "note", "noted")
    alone = ("does not", "doesn't", "is not in", "isn't in", "not in the", "no information", "no mention",
             "no such", "no reference to", "no specific", "no record", "no details", "unknown", "not possible to",
             "there is no", "there's no", "there are no", "there was no", "nowhere")
    phrases = {f"{n} {v}" for n in negations for v in verbs} | {f"{n} be {v}" for n in negations for v in verbs}
    return tuple(sorted({normalize(p) for p in phrases | set(alone)}, key=len, reverse=True))


DECLINE = _decline_phrases()
# the first word of an answer that says there is none ("None.", "No version closes it.", "Nobody is named.")
_NONE_FIRST = frozenset(("none", "no", "nobody", "nothing"))


def declines(answer: str) -> bool:
    """The answer says the input does not give it: any phrase of DECLINE as whole words, or a first word
    that says there is none."""
    a = f" {normalize(answer)} "
    return any(f" {p} " in a for p in DECLINE) or bool(_NONE_FIRST.intersection(a.split()[:1]))


def exact(answer: str, refs: list[str]) -> bool:
    """The whole answer is one of the references (a model that answers with the name alone)."""
    a = normalize(answer)
    return any(a == normalize(r) for r in refs if normalize(r))


def contains(answer: str, refs: list[str], question: str = "") -> bool:
    """A reference appears in the answer as whole words ("13" in "Section 13.", not in "130"). A reference
    that the question itself holds does not count: a model that says the question back ("According to
    GPL-3, ... 10 years") would match the alias "3" of "three" through "GPL-3"."""
    a, q = f" {normalize(answer)} ", f" {normalize(question)} "
    return any(f" {normalize(r)} " in a for r in refs if normalize(r) and f" {normalize(r)} " not in q)


def numbers(text: str) -> list[str]:
    """The numbers of `text` as whole tokens, spelled ones as digits: "three years, 2.0.9, POP3_PORT" ->
    ["3", "2.0.9"] (the 3 of an identifier is part of a word)."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _NUMBER.findall(_SPELLED.sub(lambda m: _WORDS[m.group(1)], text))


def shape(number: str) -> str:
    """What kind of number it is: its digits as 9s, its dots kept ("2.0.9" -> "9.9.9", "02110" -> "99999")."""
    return re.sub(r"\d", "9", number)


@dataclass(frozen=True)
class Verdict:
    right: bool
    gives: bool                 # the reference appears as whole words (absent: the answer declines)
    named: tuple[str, ...]      # the competing candidates and numbers the answer names


def _spans(tokens: list[str], phrase: list[str]) -> list[tuple[int, int]]:
    n = len(phrase)
    return [(i, i + n) for i in range(len(tokens) - n + 1) if n and tokens[i:i + n] == phrase]


def judge(answer: str, refs: list[str], question: str = "", candidates=(), passages=(),
          absent: bool = False) -> Verdict:
    """The strict verdict on `answer` (module docstring). `candidates`: the competing answers of the
    question; `passages`: the source text that holds the answer (its numbers are true facts beside it)."""
    refs = [r for r in refs if normalize(r)]
    tokens, q = normalize(answer).split(), f" {normalize(question)} "
    # where the answer gives a reference: a candidate inside one is part of it ("Library Public License" of
    # "GNU Library Public License"); a reference the question holds is said back, not given
    inside = [s for r in refs for s in _spans(tokens, normalize(r).split())]
    given = any(_spans(tokens, normalize(r).split()) for r in refs if f" {normalize(r)} " not in q)
    named: list[str] = []
    for c in dict.fromkeys(candidates):
        words = normalize(c).split()
        if not words or f" {' '.join(words)} " in q or normalize(c) in map(normalize, refs):
            continue
        if any(not any(a <= lo and hi <= b for a, b in inside) for lo, hi in _spans(tokens, words)):
            named.append(c)
    # numbers: a number of the shape of one the reference or its passage holds, that neither they nor the
    # question hold, is another answer of the same kind (another version, date, port, count)
    facts = [n for t in (*refs, *passages) for n in numbers(t)]
    allowed = set(facts) | set(numbers(question)) | {n for c in named for n in numbers(c)}
    shapes = {shape(n) for n in facts} | {shape(n) for c in candidates for n in numbers(c)}
    named += [n for n in dict.fromkeys(numbers(answer)) if shape(n) in shapes and n not in allowed]
    gives = declines(answer) if absent else given
    return Verdict(gives and not named, gives, tuple(named))


def question_facts(q) -> dict:
    """judge's keyword arguments for a question of the set (kvpot.bench.qa_questions.Question): its
    candidates, its passages and whether its answer is absent from the input, where the set gives them."""
    passages = getattr(q, "passages", ()) or (getattr(q, "passage", "") or "",)
    return {"candidates": tuple(getattr(q, "candidates", ()) or ()),
            "passages": tuple(p for p in passages if p),
            "absent": getattr(q, "kind", "") == "absent" or not q.answer}


def strict(answer: str, refs: list[str], question: str = "", candidates=(), passages=(), absent: bool = False) -> bool:
    return judge(answer, refs, question, candidates, passages, absent).right
