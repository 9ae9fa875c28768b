"""Prompt layout for questions about a document.

A plain completion prompt: small models retrieve facts from a long document far more
reliably this way than behind a chat template (see DESIGN.md, test models).
"""

from __future__ import annotations


def document_prefix(document: str) -> str:
    return document.rstrip() + "\n\n"


def question_suffix(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer:"


def completion_prompt(document: str, question: str) -> str:
    return document_prefix(document) + question_suffix(question)
