"""The never-write set (kvpot.safe_write): every file a command reads, runs or writes on its own is
refused as a save target, whichever path it was found by: a reopened context's recorded inputs, stdin's
file, kvpot's config, the llama.cpp log, a file an input folder's walk left out. Refusals are one line,
the file is left byte for byte as it was. The last test walks the package's source and fails where a
file is written around the single check."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.safe_write import check_append_target, protect_folder, protection_scope, resolve_target

runner = CliRunner()
FAST = ["--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1"]
ROOT = Path(__file__).resolve().parent.parent
TEXT = "The strongbox code is 4417. The lighthouse keeper wrote it down on a Tuesday.\n" * 4


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "gpl3.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture
def saved(doc, smollm2_path, tmp_path, monkeypatch) -> Path:
    """A context read from `doc` by its relative name, in the folder the later commands run in."""
    monkeypatch.chdir(tmp_path)
    ctx = tmp_path / "gpl.kvctx"
    res = runner.invoke(app, ["ask", doc.name, "Q", "--save-context", str(ctx), "-m", str(smollm2_path), *FAST])
    assert res.exit_code == 0, res.output
    return ctx


def test_a_reopened_context_never_saves_over_its_input(doc, saved, smollm2_path):
    before = _digest(doc)
    res = runner.invoke(app, ["ask", "--context", str(saved), "Who?", "--save-context", doc.name, "-n", "4"])
    assert res.exit_code == 1, res.output
    assert_one_line_error(res.stderr, "this context was read from")
    assert _digest(doc) == before


def test_chat_on_a_reopened_context_refuses_save_over_its_input(doc, saved, tmp_path):
    before = _digest(doc)
    res = runner.invoke(app, ["chat", "--context", str(saved), "-n", "4"],
                        input=f"/save {doc.name}\n/save {tmp_path / 'ok.kvctx'}\n/quit\n")
    assert res.exit_code == 0, res.output
    refusals = [ln for ln in res.stderr.splitlines() if "error: " in ln]
    assert len(refusals) == 1 and "this context was read from" in refusals[0], res.stderr
    assert _digest(doc) == before
    assert (tmp_path / "ok.kvctx").stat().st_size > 0  # the chat went on


@pytest.mark.parametrize("dash", [True, False], ids=["dash", "implicit"])
def test_stdin_redirected_from_the_save_target(doc, smollm2_path, tmp_path, dash):
    before = _digest(doc)
    args = [sys.executable, "-c", "from kvpot.cli.main import main; main()", "ask", "-m", str(smollm2_path),
            *FAST, *(["-"] if dash else []), "Who?", "--save-context", str(doc)]
    with open(doc, "rb") as stdin:
        res = subprocess.run(args, stdin=stdin, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, "stdin's file")
    assert _digest(doc) == before


def test_the_config_is_never_a_save_target(doc, smollm2_path, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.toml"
    config.write_text("[defaults]\nthreads = 1\n")
    before = _digest(config)
    res = run_cli("ask", str(doc), "Q", "-m", str(smollm2_path), *FAST, "--save-context", str(config),
                  env={"KVPOT_HOME": str(home)})
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, "kvpot's config")
    assert _digest(config) == before


def test_the_llama_log_is_never_a_save_target(doc, smollm2_path, tmp_path):
    log = tmp_path / "ll.log"
    log.write_text("an earlier run's log\n")
    before = _digest(log)
    res = run_cli("ask", str(doc), "Q", "-m", str(smollm2_path), *FAST, "--save-context", str(log),
                  env={"KVPOT_LLAMA_LOG": str(log)})
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, "the llama.cpp log")
    assert _digest(log) == before


@pytest.mark.parametrize("left_out_by", ["glob", "exclude", "gitignore"])
def test_a_file_an_input_folder_left_out_is_never_replaced(smollm2_path, tmp_path, left_out_by):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "b.txt").write_text(TEXT)
    victim = folder / "a.txt"
    victim.write_text("a file the walk leaves out\n" * 4)
    opts = {"glob": ["--glob", "b*"], "exclude": ["--exclude", "a.txt"], "gitignore": []}[left_out_by]
    if left_out_by == "gitignore":
        (folder / ".gitignore").write_text("a.txt\n")
    before = _digest(victim)
    res = runner.invoke(app, ["ask", str(folder), "Who?", *opts, "--save-context", str(victim),
                              "-m", str(smollm2_path), *FAST])
    assert res.exit_code == 1, res.output
    assert_one_line_error(res.stderr, "a file inside the input folder")
    assert _digest(victim) == before


def test_a_new_file_inside_an_input_folder_is_fine(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    with protection_scope():
        protect_folder(folder, "the input folder f")
        assert resolve_target(folder / "new.kvctx", "context") == folder / "new.kvctx"
        with pytest.raises(KvpotError, match="a file inside the input folder f"):
            resolve_target(folder / "a.txt", "context")
        alias = tmp_path / "alias"
        alias.symlink_to(folder, target_is_directory=True)
        with pytest.raises(KvpotError, match="a file inside the input folder f"):
            resolve_target(alias / "a.txt", "context")


def test_the_llama_log_refuses_what_c_cannot_append_to(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(KvpotError, match="FIFO"):
        check_append_target(fifo, "KVPOT_LLAMA_LOG")
    with pytest.raises(KvpotError, match="directory"):
        check_append_target(tmp_path, "KVPOT_LLAMA_LOG")
    if os.path.exists("/dev/full"):
        with pytest.raises(KvpotError, match="device"):
            check_append_target("/dev/full", "KVPOT_LLAMA_LOG")
    assert check_append_target(os.devnull, "KVPOT_LLAMA_LOG") == Path(os.devnull)
    assert check_append_target(tmp_path / "new.log", "KVPOT_LLAMA_LOG") == tmp_path / "new.log"


def test_a_fifo_as_llama_log_is_one_line_not_a_hang(doc, smollm2_path, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run_cli("ask", str(doc), "Q", "-m", str(smollm2_path), *FAST, env={"KVPOT_LLAMA_LOG": str(fifo)},
                  timeout=120)
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, "FIFO")


def test_the_llama_log_is_never_the_model(doc, smollm2_path, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(smollm2_path.read_bytes())
    before = _digest(model)
    res = run_cli("ask", str(doc), "Q", "-m", str(model), *FAST, env={"KVPOT_LLAMA_LOG": str(model)}, timeout=120)
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, "the model")
    assert _digest(model) == before


# -- every file-writing call in the package goes through the never-write check -------------------------

PACKAGE = [ROOT / d for d in ("kvpot", "cli", "models", "converters", "studies")]
WRITE_ATTRS = {"write_text", "write_bytes", "touch", "save", "savez", "savez_compressed", "tofile",
               "replace", "rename", "copy", "copy2", "copyfile", "copyfileobj", "move", "copytree",
               "mkstemp", "NamedTemporaryFile"}
# a function may write when it is the checked writer itself, or when every path it writes is one kvpot
# makes for itself (its build folders, its own cache under KVPOT_HOME, a pulled model through its lock);
# each one here says why it needs no check
OWN_FILES = {
    "kvpot/safe_write.py": "the checked writer itself",
    "kvpot/build/": "the runtime's build folders and wheel cache under kvpot's own cache",
    "kvpot/bench/process.py::reset_peak_rss": "/proc/PID/clear_refs, the kernel's counter reset",
    "kvpot/bench/memory_limit.py::_control": "a memory cgroup's control files, in the cgroup the run makes for itself",
    "kvpot/session/session.py::ask": "KVPOT_SAVE_LOGITS, a diagnostics folder the tests name",
    "kvpot/state/state_container.py::_arrays_bytes": "into memory (a BytesIO), not a file",
    "models/pull.py": "models, downloads and locks under KVPOT_HOME/models, each checked before it is renamed in",
    "cli/run.py::demo": "the demo's sample under KVPOT_HOME/samples",
    "models/model_hash.py": "the hash cache under KVPOT_HOME, a file kvpot owns",
    "kvpot/policies/infllm_store.py::_copy_borrowed_store": "a new store named by new_store_path under KVPOT_HOME, opened O_EXCL",
    "cli/_common.py": "opens /dev/null to quiet a closed stdout",
    "kvpot/bench/qa.py": "the joined benchmark inputs in the run's own temporary folder",
    "kvpot/bench/context.py": "the benchmark's inputs and states in its own temporary folder",
    "kvpot/bench/texts.py": "bench-texts generates its corpus into the folder the Makefile names",
}


def _write_calls(tree: ast.AST):
    """(function, line, what) of every call that can write a file: open() with a w/x/a mode, os.open
    with O_WRONLY/O_RDWR/O_CREAT, and the writers of pathlib, shutil, os, numpy and tempfile."""
    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id == "open" and len(child.args) > 1:
                    mode = child.args[1]
                    if not isinstance(mode, ast.Constant) or set(str(mode.value)) & set("wxa+"):
                        yield func, child.lineno, "open"
                elif isinstance(f, ast.Attribute) and f.attr == "open" and ast.unparse(f.value) == "os":
                    flags = ast.unparse(child.args[1]) if len(child.args) > 1 else ""
                    if any(w in flags for w in ("O_WRONLY", "O_RDWR", "O_CREAT")):
                        yield func, child.lineno, "os.open"
                elif isinstance(f, ast.Attribute) and f.attr in WRITE_ATTRS:
                    owner = ast.unparse(f.value)
                    if f.attr in ("replace", "save") and owner not in ("os", "np", "numpy"):
                        pass  # str.replace, dataclasses.replace, session.save (checked inside)
                    elif f.attr == "copy" and owner != "shutil":
                        pass  # dict.copy, np copies
                    else:
                        yield func, child.lineno, f"{owner}.{f.attr}"
            yield from visit(child, name)
    yield from visit(tree, "<module>")


def _allowed(rel: str, func: str) -> bool:
    return any(rel == key or rel.startswith(key) and key.endswith("/") or key == f"{rel}::{func}"
               for key in OWN_FILES)


def test_every_file_write_goes_through_the_never_write_check():
    """A function that writes a file must be safe_write itself or go through it (atomic_write,
    resolve_target, check_append_target); the few that write only kvpot's own files are named above."""
    checked = {"atomic_write", "resolve_target", "check_append_target", "write_text_file"}
    bypass = []
    for folder in PACKAGE:
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), rel)
            funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for func, line, what in _write_calls(tree):
                if _allowed(rel, func):
                    continue
                body = ast.unparse(funcs[func]) if func in funcs else ""
                if not any(c in body for c in checked):
                    bypass.append(f"{rel}:{line} {func}: {what}")
    assert not bypass, "file writes around kvpot.safe_write:\n" + "\n".join(bypass)


def test_the_walk_finds_a_write_that_bypasses_the_check():
    """The walk above is not vacuous: a plain write_text in an unlisted function is found."""
    tree = ast.parse("def f(p):\n    p.write_text('x')\n\ndef g(p):\n    open(p, 'wb')\n")
    assert [(f, w) for f, _, w in _write_calls(tree)] == [("f", "p.write_text"), ("g", "open")]
