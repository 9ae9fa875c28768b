"""The question set of `kvpot bench qa` (kvpot/bench/qa_set.json), checked as it loads: each question's
source is read on this machine and its quoted passage must still be in it. A question whose file this
machine lacks, or whose passage its version of the file no longer holds (another Python, another Debian
release), is skipped and counted, never asked against a text that cannot answer it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvpot.bench.qa_sources import find_passage, read_source

SET_PATH = Path(__file__).with_name("qa_set.json")


@dataclass(frozen=True)
class Question:
    id: str
    source: str          # a path; "{stdlib}" is Python's standard library folder
    question: str
    answer: str
    aliases: tuple[str, ...]
    passage: str         # quoted from the source (whitespace aside); it holds the answer
    heldout: bool        # never used to tune anything (docs/benchmarks.md lists them)

    @property
    def refs(self) -> list[str]:
        return [self.answer, *self.aliases]


@dataclass
class QuestionSet:
    questions: list[Question]
    missing_file: list[str] = field(default_factory=list)     # ids whose source this machine lacks
    missing_passage: list[str] = field(default_factory=list)  # ids whose passage the file no longer holds

    def notice(self) -> str | None:
        parts = []
        if self.missing_file:
            parts.append(f"{len(self.missing_file)} skipped: their file is not on this machine "
                         f"({', '.join(self.missing_file)})")
        if self.missing_passage:
            parts.append(f"{len(self.missing_passage)} skipped: their passage is not in this machine's version "
                         f"of the file ({', '.join(self.missing_passage)})")
        return "; ".join(parts) or None


def parse_set(path: Path = SET_PATH) -> list[Question]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [Question(q["id"], q["source"], q["question"], q["answer"], tuple(q.get("aliases", ())), q["passage"],
                     bool(q.get("heldout", False))) for q in data["questions"]]


def load_set(path: Path = SET_PATH) -> QuestionSet:
    """The questions this machine can ask, in the file's order."""
    out = QuestionSet([])
    for q in parse_set(path):
        text = read_source(q.source)
        if text is None:
            out.missing_file.append(q.id)
        elif find_passage(text, q.passage) is None:
            out.missing_passage.append(q.id)
        else:
            out.questions.append(q)
    return out
