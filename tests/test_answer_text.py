"""The answer filter (kvpot.session.answer): where an answer starts and ends, fed whole and piece by piece."""

from __future__ import annotations

import random

import pytest

from kvpot.session.answer import LINE_REPEATS, NGRAM_REPEATS, NGRAM_WORDS, AnswerText


def _run(text: str, pieces: str = "whole", **kw) -> tuple[str, AnswerText]:
    f = AnswerText(**kw)
    if pieces == "whole":
        parts = [text]
    elif pieces == "chars":
        parts = list(text)
    else:  # random cuts, as tokens fall
        rng, parts, i = random.Random(len(text)), [], 0
        while i < len(text):
            n = rng.randint(1, 5)
            parts.append(text[i:i + n])
            i += n
    shown = "".join(f.feed(p) for p in parts) + f.finish()
    return shown, f


PIECES = ("whole", "chars", "random")


@pytest.mark.parametrize("pieces", PIECES)
def test_leading_space_and_trailing_blank_lines_are_dropped(pieces):
    shown, f = _run(" \n The service is nginx.\n\n\n  ", pieces)
    assert shown == "The service is nginx." and f.stopped is None


@pytest.mark.parametrize("pieces", PIECES)
def test_inner_blank_lines_stay(pieces):
    text = "First.\n\nSecond line.\n  indented"
    assert _run(text, pieces)[0] == text


@pytest.mark.parametrize("pieces", PIECES)
def test_a_stop_string_ends_the_answer_unshown(pieces):
    shown, f = _run(" 42\nQuestion: what next?", pieces, stops=("\nQuestion:",))
    assert shown == "42" and f.stopped == "the stop string '\\nQuestion:'"


@pytest.mark.parametrize("pieces", PIECES)
def test_a_partial_stop_string_that_does_not_complete_is_shown(pieces):
    text = "see\nQuest for fire"
    assert _run(text, pieces, stops=("\nQuestion:",))[0] == text


@pytest.mark.parametrize("pieces", PIECES)
def test_completion_answers_end_at_their_line(pieces):
    shown, f = _run(" nginx logged the error.\n[ 12.3] usb 1-1: new device", pieces, one_line=True)
    assert shown == "nginx logged the error." and f.stopped == "the end of the answer's line"


@pytest.mark.parametrize("pieces", PIECES)
def test_a_looping_line_shows_at_most_twice(pieces):
    line = "# parse the next token from the stream"
    text = "def f():\n" + "\n".join([line] * 10) + "\n"
    shown, f = _run(text, pieces)
    assert shown.count(line) == LINE_REPEATS - 1 and f.loop
    assert shown == "def f():\n" + (line + "\n") * (LINE_REPEATS - 1)


@pytest.mark.parametrize("pieces", PIECES)
def test_short_lines_may_repeat(pieces):
    text = "if a:\n    x()\n}\n}\n}\n}\nend"
    shown, f = _run(text, pieces)
    assert shown == text and not f.loop


@pytest.mark.parametrize("pieces", PIECES)
def test_a_loop_within_one_line_stops(pieces):
    unit = "the value is the value of the value and"
    text = " ".join([unit] * 10)
    shown, f = _run(text, pieces)
    assert f.loop and len(shown.split()) < len(text.split())
    # it stopped at the first word that completed the NGRAM_REPEATS-th copy of a run of NGRAM_WORDS words
    words = text.split()
    seen: dict = {}
    for i in range(NGRAM_WORDS - 1, len(words)):
        g = tuple(words[i - NGRAM_WORDS + 1:i + 1])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] == NGRAM_REPEATS:
            break
    assert shown.split() == words[:len(shown.split())] and len(shown.split()) <= i


def test_ordinary_prose_is_not_a_loop():
    import kvpot.session.answer as mod

    text = (mod.__doc__ or "") * 1
    shown, f = _run(text, "random")
    assert not f.loop and shown == text.strip()


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("one_line", [False, True])
def test_a_stop_string_at_once_is_no_answer(pieces, one_line):
    shown, f = _run(" \nQuestion: and then?", pieces, stops=("\nQuestion:",), one_line=one_line)
    assert shown == "" and f.stopped == "the stop string '\\nQuestion:'"


@pytest.mark.parametrize("pieces", PIECES)
def test_a_completion_answer_may_start_after_a_line_break(pieces):
    shown, f = _run("\n\n  The captain is Marrow.\nThe ship", pieces, one_line=True)
    assert shown == "The captain is Marrow." and f.stopped == "the end of the answer's line"
