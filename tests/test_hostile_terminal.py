"""Text from outside kvpot on the terminal: a question, prompt or chat line that is not UTF-8 is refused in one
line before any reading (a chat line: the chat goes on), and file names and document text that hold control
characters (an escape sequence that clears the screen, a newline that forges a line) are shown escaped, never
raw: in the reading line, a notice, an error, every --sources line and its quotes."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.display import printable, require_utf8, undecodable
from kvpot.errors import KvpotError

FAST = ["-m", "smollm2-135m", "-t", "1", "-n", "8", "--chunk", "128", "--prompt-format", "completion"]
ESC = "\x1b"
RED_NAME = "\x1b[31mRED\x1b[2J.txt"
TITLE = "\x1b]0;PWNED\x07\x1b[2J"


def test_printable_escapes_controls_and_keeps_the_rest():
    assert printable("a\x1b[2Jb\tc\u00e9\x9b\x7f") == "a\\x1b[2Jb\tc\u00e9\\x9b\\x7f"
    assert printable("fake\nerror: x\r") == "fake\\nerror: x\\r"
    assert printable("two\nlines", newlines=True) == "two\nlines"
    assert printable("Who \udcff?") == "Who \\xff?"  # a byte surrogateescape could not decode


def test_require_utf8_refuses_lone_surrogates():
    assert not undecodable("Who is \u00e9?")
    assert require_utf8("plain", "the question") == "plain"
    with pytest.raises(KvpotError, match=r"the question is not valid UTF-8 text .*Who \\xff\?"):
        require_utf8("Who \udcff?", "the question")


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("The strongbox code is 4417. The keeper wrote it down on a Tuesday.\n" * 4)
    return path


def test_a_question_that_is_not_utf8_is_one_line_before_reading(doc, smollm2_path):
    # a str with a lone surrogate is passed to the child as the byte 0xff (os.fsencode)
    res = run_cli("ask", *FAST, str(doc), "Who \udcff?")
    assert res.returncode == 1
    assert "reading" not in res.stderr
    assert_one_line_error(res.stderr, "the question is not valid UTF-8 text")
    assert "\\xff" in res.stderr


def test_a_run_prompt_that_is_not_utf8_is_one_line_before_reading(doc, smollm2_path):
    res = run_cli("run", *FAST[:-2], "-f", str(doc), "-p", "Who \udcff?")  # run takes no --prompt-format
    assert res.returncode == 1
    assert "reading" not in res.stderr
    assert_one_line_error(res.stderr, "the prompt (-p) is not valid UTF-8 text")


def test_a_chat_line_that_is_not_utf8_is_refused_and_the_chat_goes_on(doc, smollm2_path):
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", "from kvpot.cli.main import main; main()", "chat", *FAST, str(doc)],
                         input=b"Who \xff?\n/stats\n", capture_output=True, timeout=600, env=dict(os.environ))
    stderr = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "error: the line is not valid UTF-8 text" in stderr
    assert "tokens in pot" in stderr.split("not valid UTF-8")[1]  # /stats, after the refusal


def _no_raw_controls(*texts: str) -> None:
    for text in texts:
        assert ESC not in text and "\x07" not in text, text


def test_a_file_name_with_escapes_is_shown_escaped_everywhere(tmp_path, smollm2_path):
    """The reading line, a binary file left out of a folder, a file that does not exist, a newline in a
    name that would forge a line; and --sources quotes of a document that holds a title-setting sequence."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / RED_NAME).write_text(f"The strongbox code is 4417.{TITLE} The keeper wrote it down.\n" * 4)
    (folder / f"{ESC}[2Jbin.dat").write_bytes(b"\0\x01\x02binary" * 64)
    (folder / "fake\nerror: forged.txt").write_bytes(b"\0\x01\x02binary" * 64)
    res = run_cli("ask", *FAST, "-v", "--sources", str(folder), "What is the strongbox code?")
    assert res.returncode == 0, res.stderr
    _no_raw_controls(res.stdout, res.stderr)
    assert "\\x1b[31mRED\\x1b[2J.txt" in res.stderr  # the reading line or its notices name it, escaped
    assert not any(line.startswith("error: forged") for line in res.stderr.splitlines())
    assert "fake\\nerror: forged.txt" in res.stderr
    assert "sources:" in res.stdout and "\\x1b[31mRED" in res.stdout
    assert "\\x1b]0;PWNED\\x07" in res.stdout  # the quote, escaped

    single = run_cli("ask", *FAST, "--sources", str(folder / RED_NAME), "What is the strongbox code?")
    assert single.returncode == 0, single.stderr
    _no_raw_controls(single.stdout, single.stderr)
    assert " · \\x1b[31mRED\\x1b[2J.txt · " in single.stderr.replace(str(folder) + "/", "")

    as_json = run_cli("ask", *FAST, "--json", "--sources", str(folder / RED_NAME), "What is the strongbox code?")
    assert as_json.returncode == 0, as_json.stderr
    _no_raw_controls(as_json.stdout, as_json.stderr)
    assert json.loads(as_json.stdout)["inputs"]["read"][0].endswith(RED_NAME)  # JSON keeps the name exact


def test_a_missing_file_with_escapes_in_its_name_is_one_escaped_line(tmp_path):
    missing = tmp_path / f"{ESC}[2Jgone\nerror: forged.txt"
    res = run_cli("ask", *FAST, str(missing), "Q?")
    assert res.returncode == 1
    _no_raw_controls(res.stderr)
    assert_one_line_error(res.stderr, "\\x1b[2Jgone\\nerror: forged.txt")
