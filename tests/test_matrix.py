"""The CLI over the classes of hostile input (models, documents, options, saved contexts, saves,
pulls): for each, the exit code, exactly one `error:` line on stderr and no traceback, no file
in the work folder changed that should not be, and no temporary file left.

Every case runs in a fresh process with its own KVPOT_HOME (its models folder links to the
pulled test models), so no state of the machine or of other tests plays a part."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.bench.logbook import logbook
from kvpot.models.pull import cached_path
from kvpot.models.registry import SMOLLM2_135M

FAST = ["-m", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1"]


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            link = os.readlink(p) if p.is_symlink() else None
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, link)
    return out


def _temps(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith((".tmp", ".part"))]


@pytest.fixture(scope="module")
def home(tmp_path_factory, smollm2_path):
    h = tmp_path_factory.mktemp("home")
    (h / "models").symlink_to(cached_path(SMOLLM2_135M).parent, target_is_directory=True)
    return h


@pytest.fixture(scope="module")
def saved(home, tmp_path_factory):
    """A good saved context, made once by the CLI itself."""
    folder = tmp_path_factory.mktemp("saved")
    doc = folder / "doc.txt"
    doc.write_text(logbook(n_entries=8)[0])
    ctx = folder / "doc.kvctx"
    res = run_cli("ask", str(doc), "q?", "--save-context", str(ctx), *FAST, env={"KVPOT_HOME": str(home)})
    assert res.returncode == 0, res.stderr
    return ctx


def _work(w: Path) -> dict:
    """The work folder every case starts from: a document, an empty file, a binary file, a folder,
    a FIFO, a link to /dev/null, a file that is not a GGUF."""
    (w / "doc.txt").write_text(logbook(n_entries=8)[0])
    (w / "empty.txt").write_text("")
    (w / "bin.dat").write_bytes(b"\x00\x01\x02" * 100)
    (w / "folder").mkdir()
    os.mkfifo(w / "pipe")
    (w / "null.kvctx").symlink_to("/dev/null")
    (w / "fake.gguf").write_text("not a model")
    (w / "junk.kvctx").write_bytes(b"junk" * 100)
    return {"doc": str(w / "doc.txt")}


# (id, argv with {doc}, {w} and {saved} filled in, exit code, needle in the error line)
CASES = [
    # models
    ("model-hf-not-pulled", ["ask", "{doc}", "q?", "-m", "hf:someone/repo/model.gguf"], 1, "run `kvpot pull hf:someone"),
    ("model-unknown", ["ask", "{doc}", "q?", "-m", "nope"], 1, "unknown model 'nope'"),
    ("model-directory", ["ask", "{doc}", "q?", "-m", "{w}/folder"], 1, "is a directory"),
    ("model-not-gguf", ["ask", "{doc}", "q?", "-m", "{w}/fake.gguf"], 1, "is not a GGUF file"),
    ("model-fifo", ["ask", "{doc}", "q?", "-m", "{w}/pipe"], 1, "not a regular file"),
    # documents
    ("doc-missing", ["ask", "{w}/missing.txt", "q?", *FAST], 1, "does not exist"),
    ("doc-empty", ["ask", "{w}/empty.txt", "q?", *FAST], 1, "the input is empty"),
    ("doc-binary", ["ask", "{w}/bin.dat", "q?", *FAST], 1, "every input is binary"),
    ("doc-empty-path", ["ask", "", "q?", *FAST], 1, "an input path is empty"),
    ("doc-no-question", ["ask", "{doc}"], 1, "no question"),
    # options
    ("threads-zero", ["ask", "{doc}", "q?", *FAST, "--threads", "0"], 1, "--threads must be at least 1"),
    ("threads-negative", ["ask", "{doc}", "q?", *FAST, "--threads", "-2"], 1, "--threads must be at least 1"),
    ("threads-too-many", ["ask", "{doc}", "q?", *FAST, "--threads", "1000"], 1, "more than the"),
    ("n-predict-zero", ["ask", "{doc}", "q?", *FAST, "--n-predict", "0"], 1, "--n-predict must be at least 1"),
    ("budget-tiny", ["ask", "{doc}", "q?", *FAST, "--budget", "8"], 1, "--budget 8 is too small"),
    ("budget-huge", ["ask", "{doc}", "q?", *FAST, "--budget", "500000000"], 1, "lower --budget"),
    ("question-too-long", ["ask", "{doc}", "Which crew member " * 20 + "?", *FAST, "--budget", "32"], 1,
     "the question is too long for the budget"),
    ("policy-unknown", ["ask", "{doc}", "q?", *FAST, "--policy", "nope"], 1, "unknown policy"),
    # saved contexts
    ("context-empty", ["ask", "--context", "", "q?"], 1, "--context needs the path"),
    ("context-directory", ["ask", "--context", "{w}/folder", "q?"], 1, "is a directory"),
    ("context-junk", ["ask", "--context", "{w}/junk.kvctx", "q?"], 1, "is not a kvpot saved context"),
    ("context-with-budget", ["ask", "--context", "{saved}", "q?", "--budget", "100"], 1, "--budget cannot change"),
    ("context-with-policy", ["chat", "--context", "{saved}", "--policy", "snapkv"], 1, "--policy cannot change"),
    ("context-with-files", ["ask", "{doc}", "--context", "{saved}", "q?"], 1, "not both"),
    # saves (refused before reading)
    ("save-directory", ["ask", "{doc}", "q?", *FAST, "--save-context", "{w}/folder"], 1, "is a directory"),
    ("save-fifo", ["ask", "{doc}", "q?", *FAST, "--save-context", "{w}/pipe"], 1, "not a regular file"),
    ("save-link-to-device", ["ask", "{doc}", "q?", *FAST, "--save-context", "{w}/null.kvctx"], 1, "not a regular file"),
    ("save-empty", ["ask", "{doc}", "q?", *FAST, "--save-context", ""], 1, "the path is empty"),
    ("save-no-folder", ["ask", "{doc}", "q?", *FAST, "--save-context", "{w}/no/x.kvctx"], 1, "does not exist"),
    ("chat-save-directory", ["chat", "{doc}", *FAST, "--save-context", "{w}/folder"], 1, "is a directory"),
    # pulls
    ("pull-unknown", ["pull", "nope"], 1, "unknown model 'nope'"),
    ("pull-bad-hf", ["pull", "hf:just-a-name"], 1, "expected hf:OWNER/REPO/FILE.gguf"),
]


@pytest.mark.parametrize("case_id, argv, code, needle", CASES, ids=[c[0] for c in CASES])
def test_matrix(case_id, argv, code, needle, tmp_path, home, saved):
    w = tmp_path / "work"
    w.mkdir()
    names = _work(w)
    fill = {"doc": names["doc"], "w": str(w), "saved": str(saved)}
    args = [a.format(**fill) if "{" in a else a for a in argv]
    before, saved_before = _snapshot(w), _snapshot(saved.parent)
    res = run_cli(*args, env={"KVPOT_HOME": str(home)}, input="", timeout=600)
    assert res.returncode == code, res.stderr
    assert_one_line_error(res.stderr, needle)
    assert _snapshot(w) == before, "a file changed that should not have"
    assert _snapshot(saved.parent) == saved_before
    assert _temps(w) == [] and _temps(saved.parent) == []
