"""Scoring for `kvpot bench qa`: an answer is right when a reference answer (or an accepted alias)
appears in it as whole words, after both are normalized (case, punctuation, whitespace)."""

from __future__ import annotations

import re
import unicodedata

_PUNCT = re.compile(r"[^\w]+")


def normalize(text: str) -> str:
    """Lower case, accents kept, every run of punctuation or whitespace one space ("2.0.9" -> "2 0 9")."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(_PUNCT.sub(" ", text).replace("_", " ").split())


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
