"""The prompt kvpot builds around a document and questions, against the model's own template rendering.

The reference is llama.cpp's rendering of the whole conversation as messages (the same template code a
stock llama.cpp chat uses), so the segments must add up to exactly that text."""

import pytest

from kvpot.session.prompting import GROUNDING, ChatFormat, CompletionFormat, choose_format

DOC = "int main(void) {\n    return 0;\n"   # ends mid-file, as a cut document does
Q1, A1, Q2 = "  Who wrote cmp?  ", "Paul Eggert.", "And diff?"


def _asked(question: str) -> str:
    """A question as the user would type it after the instruction to answer from the document."""
    return GROUNDING + "\nQuestion: " + question.strip()


def _text(segments) -> str:
    return "".join(s.text for s in segments)


@pytest.fixture(params=["smol", "qwen05"])
def chat(request):
    model = request.getfixturevalue(request.param)
    template = model.chat_template()
    return ChatFormat(lambda msgs, add: model.apply_template(template, msgs, add)), model, template


def test_the_first_turn_is_the_template_rendering_of_the_document_and_a_labelled_question(chat):
    fmt, model, template = chat
    got = _text(fmt.document_open()) + DOC + _text(fmt.first_question(Q1))
    want = model.apply_template(template, [("user", DOC + "\n\n" + _asked(Q1))], True)
    assert got == want


def test_the_question_before_the_document_is_inside_the_same_user_turn(chat):
    """--question-before: the first user message is the question, the document, the question again, as
    the template renders that one message; the question is text, never parsed for control tokens."""
    fmt, model, template = chat
    got = _text(fmt.document_open(Q1)) + DOC + _text(fmt.first_question(Q1))
    message = "Question: " + Q1.strip() + "\n\nDocument:\n" + DOC + "\n\n" + _asked(Q1)
    assert got == model.apply_template(template, [("user", message)], True)
    assert [s.special for s in fmt.document_open(Q1)] == [True, False]
    assert fmt.document_open(None) == fmt.document_open()
    plain = CompletionFormat()
    assert _text(plain.document_open(Q1)) + DOC + _text(plain.first_question(Q1)) == \
        "Question: " + Q1.strip() + "\n\nDocument:\n" + DOC + "\n\nQuestion: " + Q1.strip() + "\nAnswer:"


def test_a_follow_up_is_a_new_user_turn_after_the_answer(chat):
    fmt, model, template = chat
    got = (_text(fmt.document_open()) + DOC + _text(fmt.first_question(Q1)) + A1 + _text(fmt.follow_up(Q2)))
    want = model.apply_template(template, [("user", DOC + "\n\n" + _asked(Q1)), ("assistant", A1),
                                           ("user", _asked(Q2))], True)
    assert got == want


def test_only_template_markup_is_parsed_for_control_tokens(chat):
    fmt = chat[0]
    for seg in [*fmt.document_open(), *fmt.first_question(Q1), *fmt.follow_up(Q2)]:
        assert seg.special == (Q1.strip() not in seg.text and Q2 not in seg.text)


def test_auto_picks_the_template_when_the_model_has_one_and_completion_otherwise(smol, gemma):
    assert isinstance(choose_format(smol), ChatFormat)
    assert not gemma.chat_template()   # Gemma-3-270M is the base model: no template
    assert isinstance(choose_format(gemma), CompletionFormat)
    assert isinstance(choose_format(smol, "completion"), CompletionFormat)
    assert _text(CompletionFormat().first_question(Q1)) == "\n\nQuestion: Who wrote cmp?\nAnswer:"
