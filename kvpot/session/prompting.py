"""How a document and questions become a prompt: the model's chat template or plain completion.

A prompt is a list of segments; template markup is tokenized with control tokens parsed, the
user's text (document, question) never is, so a document that contains "<|im_end|>" stays text.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpot.errors import KvpotError

PROMPT_CHOICES = ("auto", "chat", "completion")

# What an instruct model is told with every question: answer from the document, and say so where it does not
# say rather than answer from what the model knows (a confident invention reads like a fact). It goes with
# the question, after the document (the line that ends the document, the question right after it), so it is
# among the last tokens read before the answer and a pot, which reads the question after the document in
# chat, never has to keep it. kvpot.bench.qa_score.declines recognises the answer it asks for, and the
# models' own ways of saying it.
GROUNDING = "Answer from the document above. If the document does not say, answer: The document does not say."


@dataclass(frozen=True)
class Segment:
    text: str
    special: bool = False   # parse control tokens (template markup only)


def question_suffix(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer:"


def question_before(question: str | None) -> list[Segment]:
    """The question put before the document too (RunSettings.question_before), so each token of the
    document is read knowing what is asked: Liu et al. 2023 ("Lost in the Middle", query-aware
    contextualization) found it lifts key-value retrieval; the question is still asked after it."""
    return [Segment(f"Question: {question.strip()}\n\nDocument:\n")] if question else []


class CompletionFormat:
    """Plain completion: the document, then "Question: ...\\nAnswer:" (for base models). `grounding` (none
    unless given: a base model continues text rather than follows instructions) goes before the question as
    the chat format puts it; the benchmark of GROUNDING measures both (docs/benchmarks.md)."""

    name = "completion"
    stop = ("\nQuestion:", "\nAnswer:")   # a base model goes on to invent the next exchange

    def __init__(self, grounding: str = ""):
        self.grounding = grounding.strip()

    def document_open(self, question: str | None = None) -> list[Segment]:
        """What comes before the document; `question`: put before it too (question_before)."""
        return question_before(question)

    def first_question(self, question: str) -> list[Segment]:
        return [Segment("\n\n" + (self.grounding + "\n" if self.grounding else "") + question_suffix(question))]

    def follow_up(self, question: str) -> list[Segment]:
        return self.first_question(question)


# sentinels that cannot occur in a template's own markup
_U1, _A1, _U2 = "\x01kvpot-user-1\x01", "\x01kvpot-assistant-1\x01", "\x01kvpot-user-2\x01"


class ChatFormat:
    """The model's chat template: the document and the first question form the first user turn;
    each follow-up closes the answer and opens a new user turn. The template is rendered once by
    llama.cpp with sentinel messages and cut at them, so any template llama.cpp knows works.

    Every question is put after `grounding` (GROUNDING; "" leaves it out, as the benchmark's baseline asks)."""

    name = "chat"
    stop: tuple[str, ...] = ()   # answers end at the template's end-of-turn token

    def __init__(self, render, grounding: str = GROUNDING):
        self.grounding = grounding.strip()
        one = render([("user", _U1)], True)
        two = render([("user", _U1), ("assistant", _A1), ("user", _U2)], True)
        if _U1 not in one or _U2 not in two or _A1 not in two:
            raise KvpotError("the model's chat template drops message text; use --prompt-format completion")
        self._open, self._close_user = one.split(_U1)
        self._between = two.split(_A1)[1].split(_U2)[0]      # end of answer .. start of next user turn
        self._close_user2 = two.split(_U2)[1]

    def document_open(self, question: str | None = None) -> list[Segment]:
        return [Segment(self._open, True), *question_before(question)]

    def _asked(self, question: str) -> str:
        return (self.grounding + "\n" if self.grounding else "") + "Question: " + question.strip()

    def first_question(self, question: str) -> list[Segment]:
        # labelled: after a document that stops mid-file, a bare question reads as more of the
        # document and the model repeats it instead of answering
        return [Segment("\n\n" + self._asked(question)), Segment(self._close_user, True)]

    def follow_up(self, question: str) -> list[Segment]:
        # each question carries the instruction: full attention drops a long conversation's oldest turns
        # (Session.ask), the first with them, and a pot may not keep it
        if not self.grounding:
            return [Segment(self._between, True), Segment(question.strip()), Segment(self._close_user2, True)]
        return [Segment(self._between, True), Segment(self._asked(question)), Segment(self._close_user2, True)]


def question_frame(fmt) -> str:
    """How `fmt` puts a first question after the document, "{question}" standing for it: benchmarks
    record it beside each answer, so results asked with another prompt are never mixed in."""
    return "".join(seg.text for seg in fmt.first_question("{question}"))


def choose_format(model, choice: str = "auto", grounding: str = GROUNDING):
    """auto: the chat template when the GGUF has one (instruct models), else plain completion. `grounding`:
    what the chat format says before each question (ChatFormat)."""
    if choice not in PROMPT_CHOICES:
        raise KvpotError(f"prompt format must be one of {', '.join(PROMPT_CHOICES)}, got {choice!r}")
    template = model.chat_template()
    if choice == "completion" or (choice == "auto" and not template):
        return CompletionFormat()
    if not template:
        raise KvpotError("this model has no chat template (a base model); use --prompt-format completion")
    return ChatFormat(lambda msgs, add: model.apply_template(template, msgs, add), grounding)
