"""How chat reads a question (cli/_chat_input.py): a backslash continues a line, plain lines where
Python has no readline, a bounded history per document under KVPOT_HOME written through safe_write, and
/help wrapped between words to the width it is given."""

from __future__ import annotations

import io
import sys
import types

import pytest

from kvpot.cli._chat_input import HISTORY_LINES, ChatInput, history_path


class _Tty(io.StringIO):
    """Text that says it is a terminal (and has no descriptor: nothing waits on it)."""

    def isatty(self) -> bool:
        return True


def test_a_backslash_continues_the_question(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("first \\\nsecond\nthird\n"))
    reader = ChatInput()
    assert not reader.editing
    assert reader.read() == "first \nsecond"
    assert reader.read() == "third"
    with pytest.raises(EOFError):
        reader.read()


def test_without_readline_the_chat_reads_plain_lines(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "readline", None)  # `import readline` fails, as on some Termux builds
    monkeypatch.setattr(sys, "stdin", _Tty("a question\n"))
    monkeypatch.setattr(sys, "stdout", _Tty())
    reader = ChatInput(tmp_path / "history.txt")
    assert not reader.editing and reader.history is None
    assert reader.read() == "a question"
    assert not (tmp_path / "history.txt").exists()


class _FakeReadline(types.ModuleType):
    """readline's history calls, kept in a list; input() adds each line, as readline's auto-history does."""

    def __init__(self):
        super().__init__("readline")
        self.items: list[str] = []

    def clear_history(self):
        self.items.clear()

    def add_history(self, line):
        self.items.append(line)

    def get_current_history_length(self):
        return len(self.items)

    def get_history_item(self, i):
        return self.items[i - 1]


def _typed(monkeypatch, lines: list[str], rl: _FakeReadline) -> list[str]:
    prompts: list[str] = []

    def fake_input(prompt=""):
        prompts.append(prompt)
        if not lines:
            raise EOFError
        line = lines.pop(0)
        rl.add_history(line)
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    return prompts


def test_history_per_document_bounded_and_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))
    rl = _FakeReadline()
    monkeypatch.setitem(sys.modules, "readline", rl)
    monkeypatch.setattr(sys, "stdin", _Tty())
    monkeypatch.setattr(sys, "stdout", _Tty())
    path = history_path(["book.txt"], None)
    assert path.parent == tmp_path / "home" / "history"
    assert history_path(["book.txt"], None) == path != history_path(["other.txt"], None)
    assert history_path([], "book.kvpot") != path  # a reopened context keeps its own
    path.parent.mkdir(parents=True)
    path.write_text("".join(f"old {i}\n" for i in range(HISTORY_LINES + 5)))
    reader = ChatInput(path)
    assert reader.editing and len(rl.items) == HISTORY_LINES and rl.items[-1] == f"old {HISTORY_LINES + 4}"
    prompts = _typed(monkeypatch, ["who kept \\", "the log?"], rl)
    assert reader.read() == "who kept \nthe log?"
    assert prompts == ["you> ", "...> "]  # readline shows the prompt: it is part of the line it edits
    kept = path.read_text().splitlines()
    assert len(kept) == HISTORY_LINES and kept[-2:] == ["who kept \\", "the log?"], kept[-3:]
    assert path.stat().st_mode & 0o777 == 0o600  # the user's questions are theirs alone
    # read back by the next chat on the same document
    again = _FakeReadline()
    monkeypatch.setitem(sys.modules, "readline", again)
    ChatInput(path)
    assert again.items[-1] == "the log?"


def test_history_is_written_through_the_checked_writer(monkeypatch, tmp_path):
    """A history path that is a protected file (an input) is refused by safe_write: said, and not kept."""
    from kvpot.safe_write import protect, protection_scope

    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))
    rl = _FakeReadline()
    monkeypatch.setitem(sys.modules, "readline", rl)
    monkeypatch.setattr(sys, "stdin", _Tty())
    monkeypatch.setattr(sys, "stdout", _Tty())
    doc = tmp_path / "doc.txt"
    doc.write_text("precious\n")
    with protection_scope():
        protect(doc, "the input")
        reader = ChatInput(doc)
        _typed(monkeypatch, ["a question"], rl)
        assert reader.read() == "a question"
    assert doc.read_text() == "precious\n" and reader.history is None


@pytest.mark.parametrize("width", [30, 50, 80, 132])
def test_help_is_wrapped_between_words(width):
    from kvpot.cli.ask import CHAT_COMMANDS, CHAT_INPUT_HELP, chat_help

    text = chat_help(width)
    assert all(len(line) <= width for line in text.splitlines()), text
    words = text.split()
    for name, description in CHAT_COMMANDS:
        assert " ".join(description.split()) in " ".join(words), description  # no word cut in two
    assert all(w in words for w in CHAT_INPUT_HELP.split() if "\\" not in w)
