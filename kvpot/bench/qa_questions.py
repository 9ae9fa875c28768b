"""The question set of `kvpot bench qa` (kvpot/bench/qa_set.json), checked as it loads: each question's
source is read on this machine and its quoted passages must still be in it. A question whose file this
machine lacks, or whose passage its version of the file no longer holds (another Python, another Debian
release), is skipped and counted, never asked against a text that cannot answer it; so is a generated
question whose computed answer this machine's file no longer backs (a whole-document question on a file
whose sha256 differs, an absent question whose asked-for thing the file now names).

Kinds (the set's "about" says how many of each): "lexical" (the question repeats a content word of its
passage beyond the subject's name: kvpot.bench.qa_words), "paraphrase" (it repeats none), "two-passage"
(the answer needs two passages of one document, both in `passages`), "whole" (about the document as a
whole: asked with the whole source as the input, alone, never inside a haystack; no passage), "absent"
(the input does not hold the answer: the reference is empty and `absent` names the asked-for thing, which
the source never holds; its passage is where such a thing would be said, so its excerpt reads as the
others do).

`candidates` are competing answers of the reference's type computed from the source (other versions, bug
numbers, signers, dates, numbers of the reference's shape), which a strict scorer counts wrong when an
answer names one. A hand-written question whose answer is a name has none: its source holds no computed
list of the same type (kvpot.bench.qa_generate.hand_candidates)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kvpot.bench.qa_sources import find_passage, read_source, resolve

SET_PATH = Path(__file__).with_name("qa_set.json")


@dataclass(frozen=True)
class Question:
    id: str
    source: str          # a path; "{stdlib}" is Python's standard library folder
    question: str
    answer: str          # empty for an "absent" question
    aliases: tuple[str, ...]
    passage: str         # quoted from the source (whitespace aside); it holds the answer ("" for "whole")
    heldout: bool        # never used to tune anything (docs/benchmarks.md lists them)
    kind: str = "lexical"
    candidates: tuple[str, ...] = ()
    passages: tuple[str, ...] = ()  # every passage the answer needs, the first being `passage`
    absent: str = ""     # "absent": what the question asks about, which the source never holds
    sha256: str = ""     # generated questions: the source's sha256 their computed answer was taken from

    def __post_init__(self):
        if not self.passages and self.passage:
            object.__setattr__(self, "passages", (self.passage,))

    @property
    def refs(self) -> list[str]:
        return [self.answer, *self.aliases]

    @property
    def whole_input(self) -> bool:
        """Asked with its whole source as the input, alone (kvpot.bench.qa_inputs.whole_inputs)."""
        return self.kind == "whole"


@dataclass
class QuestionSet:
    questions: list[Question]
    missing_file: list[str] = field(default_factory=list)     # ids whose source this machine lacks
    missing_passage: list[str] = field(default_factory=list)  # ids whose passage the file no longer holds
    changed: list[str] = field(default_factory=list)          # ids whose computed answer the file no longer backs

    def notice(self) -> str | None:
        parts = []
        if self.missing_file:
            parts.append(f"{len(self.missing_file)} skipped: their file is not on this machine "
                         f"({', '.join(self.missing_file)})")
        if self.missing_passage:
            parts.append(f"{len(self.missing_passage)} skipped: their passage is not in this machine's version "
                         f"of the file ({', '.join(self.missing_passage)})")
        if self.changed:
            parts.append(f"{len(self.changed)} skipped: this machine's version of their file no longer backs "
                         f"their computed answer ({', '.join(self.changed)})")
        return "; ".join(parts) or None


def parse_set(path: Path = SET_PATH) -> list[Question]:
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for q in data["questions"]:
        passages = tuple(q.get("passages") or ([q["passage"]] if q.get("passage") else []))
        out.append(Question(q["id"], q["source"], q["question"], q["answer"], tuple(q.get("aliases", ())),
                            passages[0] if passages else "", bool(q.get("heldout", False)),
                            q.get("kind", "lexical"), tuple(q.get("candidates", ())), passages,
                            q.get("absent", ""), q.get("sha256", "")))
    return out


def holds(text: str, thing: str) -> bool:
    """Whether the source text holds the asked-for thing of an "absent" question anywhere (as a substring:
    a bug number inside a longer number counts as held)."""
    return thing in text


def load_set(path: Path = SET_PATH) -> QuestionSet:
    """The questions this machine can ask, in the file's order."""
    out = QuestionSet([])
    for q in parse_set(path):
        text = read_source(q.source)
        if text is None:
            out.missing_file.append(q.id)
        elif any(find_passage(text, p) is None for p in q.passages):
            out.missing_passage.append(q.id)
        elif (q.kind == "absent" and (not q.absent or holds(text, q.absent))) or \
                (q.kind == "whole" and q.sha256 and source_sha256(q.source) != q.sha256):
            out.changed.append(q.id)
        else:
            out.questions.append(q)
    return out


def source_sha256(source: str) -> str | None:
    """The sha256 of the source's file as stored (compressed where it is), or None when it is missing."""
    try:
        return hashlib.sha256(resolve(source).read_bytes()).hexdigest()
    except OSError:
        return None
