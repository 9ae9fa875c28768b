"""The Python API (kvpot.Model, kvpot.Document): it answers as `kvpot ask` and `kvpot chat` do on the same file
and settings, a saved document reopens to the same answer, bad input is refused in one line before libllama
loads, and the progress callback counts up to the input's tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import kvpot
from kvpot.bench.logbook import logbook
from kvpot.cli.main import app

# past a 512-cell pot, so the answer comes from the focused read of the passages the pot's answer locates
SETTINGS = {"budget": 512, "chunk": 128, "max_tokens": 12, "prompt": "completion", "threads": 2}
CLI = ["--budget", "512", "--chunk", "128", "-n", "12", "--prompt-format", "completion", "--threads", "2"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    text, question, _ = logbook()
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question


@pytest.fixture(scope="module")
def by_api(doc, smollm2_cut_path, tmp_path_factory):
    """Read, saved, then asked through the API; the progress callback's calls recorded."""
    path, question = doc
    ctx = tmp_path_factory.mktemp("ctx") / "logbook.kvctx"
    seen: list[tuple[int, int | None]] = []
    model = kvpot.Model(smollm2_cut_path)
    with model.read([path], question, progress=lambda n, total: seen.append((n, total)), **SETTINGS) as read:
        read.save(ctx)
        answer = read.ask(question)
        tokens = read.tokens
    return answer, ctx, seen, tokens


def test_ask_answers_as_kvpot_ask_does(by_api, doc, smollm2_cut_path):
    path, question = doc
    answer = by_api[0]
    res = CliRunner().invoke(app, ["ask", str(path), question, "--json", "-m", str(smollm2_cut_path), *CLI])
    assert res.exit_code == 0, res.output
    reference = json.loads(res.stdout)
    assert answer.text, "an empty answer compares nothing"
    assert (answer.text, answer.stop_reason) == (reference["answer"], reference["stop_reason"])
    # both went past the pot to the focused read, and read the same passages
    assert answer.focus is not None and "focus" in reference
    assert answer.focus["passages"] == reference["focus"]["passages"]


def test_a_saved_document_reopens_to_the_same_answer(by_api, doc, smollm2_cut_path):
    answer, ctx, _, _ = by_api
    _, question = doc
    with kvpot.Document.open(ctx, kvpot.Model(smollm2_cut_path)) as reopened:
        again = reopened.ask(question)
    assert (again.text, again.stop_reason) == (answer.text, answer.stop_reason)


def test_chat_answers_as_kvpot_chat_does(doc, smollm2_cut_path):
    """Two turns of Document.chat against `kvpot chat` on the same file and settings, its questions typed on
    stdin: both past the pot, each question's passages read again with the conversation so far after them."""
    path, question = doc
    questions = ["Who kept the log?", question]
    with kvpot.Model(smollm2_cut_path).read([path], policy="infinipot", **SETTINGS) as read:
        answers = [read.chat(q) for q in questions]
    res = CliRunner().invoke(app, ["chat", str(path), "-m", str(smollm2_cut_path), "-P", "infinipot", *CLI],
                             input="".join(q + "\n" for q in questions) + "/quit\n")
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert all(a.text for a in answers), "an empty answer compares nothing"
    assert [line.strip() for line in res.stdout.splitlines()] == [a.text for a in answers], res.stdout
    assert all(a.focus is not None for a in answers) and res.stderr.count("focus: ") == 2, res.stderr


def test_progress_counts_up_to_the_input(by_api):
    _, _, seen, tokens = by_api
    counts = [n for n, _ in seen]
    assert len(seen) > 2 and counts == sorted(counts)
    assert seen[-1] == (tokens, tokens)
    assert all(total is None or n <= total for n, total in seen)


REFUSALS = """
import json, sys, kvpot
from pathlib import Path
good, empty = sys.argv[1], sys.argv[2]
for make in (lambda: kvpot.Model("/no/such/model.gguf"),
             lambda: kvpot.Model(good).read([empty], budget=512),
             lambda: kvpot.Model(good).read([good], policy="no-such-policy"),
             lambda: kvpot.Model(good).read([good], budget=512, colour="red")):
    try:
        make()
    except kvpot.KvpotError as e:
        print(json.dumps(str(e)))
    else:
        print("accepted")
loaded = [line for line in Path("/proc/self/maps").read_text().splitlines() if "libllama" in line]
print("libllama loaded" if loaded else "libllama not loaded")
"""


def test_bad_input_is_one_line_before_the_model_loads(smollm2_cut_path, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = subprocess.run([sys.executable, "-c", REFUSALS, str(smollm2_cut_path), str(empty)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "libllama not loaded", out.stdout
    errors = [json.loads(line) for line in lines[:-1]]  # one JSON string per refusal
    assert len(errors) == 4 and all(e and "\n" not in e for e in errors), out.stdout
    assert "no-such-policy" in errors[2] and "colour" in errors[3]


def test_importing_kvpot_loads_neither_the_api_nor_the_runtime():
    code = "import sys, kvpot; print(sorted(m for m in sys.modules if m.startswith(('kvpot.', 'llama'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # kvpot.version (the version and ABI numbers the root re-exports) is all it loads
    assert out.returncode == 0 and out.stdout.strip() == "['kvpot.version']", out.stdout + out.stderr
