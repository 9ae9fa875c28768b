"""One option, one meaning: llama.cpp's names where kvpot has the same thing, and the old spellings
kept as hidden aliases (a note on stderr) that set the same parameter to the same value."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.session.settings import RunSettings

ROOT = typer.main.get_command(app)


def command(path: str):
    cmd = ROOT
    for name in path.split():
        cmd = cmd.commands[name]
    return cmd


def parse(path: str, args: list[str]) -> dict:
    """The parameters a command line gives the command, without running it."""
    cmd = command(path)
    with cmd.make_context(path, list(args)) as ctx:
        # a repeatable option's values as a list (typers before 0.29 leave click's tuple here)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in ctx.params.items()}


# command, old spelling, new spelling, value, parameter, parsed value
ALIASES = [
    ("ask", "--max-tokens", "--n-predict", "7", "max_tokens", 7),
    ("ask", "--prompt", "--prompt-format", "completion", "prompt", "completion"),
    ("chat", "--max-tokens", "--n-predict", "7", "max_tokens", 7),
    ("chat", "--prompt", "--prompt-format", "chat", "prompt", "chat"),
    ("run", "--max-tokens", "--n-predict", "7", "max_tokens", 7),
    ("run", "--ctx", "--ctx-size", "512", "ctx", 512),
    ("bench ppl", "--max-tokens", "--tokens", "700", "max_tokens", 700),
    ("bench throughput", "-n", "--tokens", "700", "tokens", [700]),
    ("bench context", "-n", "--tokens", "700", "tokens", [700]),
    ("bench niah", "-n", "--length", "700", "lengths", [700]),
]
REQUIRED = {"ask": ["doc.txt", "q?"], "chat": [], "run": ["-f", "doc.txt", "-p", "q?"], "bench ppl": ["-f", "doc.txt"]}


@pytest.mark.parametrize("path,old,new,value,param,parsed", ALIASES)
def test_old_spelling_is_the_new_option(path, old, new, value, param, parsed, capsys):
    base = REQUIRED.get(path, [])
    assert parse(path, [*base, new, value])[param] == parsed
    assert capsys.readouterr().err == ""  # the new name says nothing
    assert parse(path, [*base, old, value])[param] == parsed
    note = capsys.readouterr().err
    assert f"{old} is deprecated" in note and new in note and len(note.strip().splitlines()) == 1
    assert parse(path, [*base, f"{old}={value}" if old.startswith("--") else old + value])[param] == parsed


@pytest.mark.parametrize("path,old,new,value,param,parsed", ALIASES)
def test_old_spelling_is_hidden(path, old, new, value, param, parsed):
    shown = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "300"}).output
    assert new in shown
    opts = {o for p in command(path).params for o in p.opts}
    assert old not in opts  # the help lists only the new name; the old one is rewritten before parsing


@pytest.mark.parametrize("path", ["ask", "chat", "run"])
def test_n_is_n_predict_with_one_default(path):
    """-n/--n-predict: the answer's tokens, one default (256) in ask, chat and run."""
    opt = next(p for p in command(path).params if p.name == "max_tokens")
    assert set(opt.opts) == {"-n", "--n-predict"}
    assert opt.default is None and opt.show_default == str(RunSettings.max_tokens) == "256"  # None: settings give 256
    assert parse(path, [*REQUIRED[path], "-n", "9"])["max_tokens"] == 9


def test_llama_cpp_names():
    run = {o for p in command("run").params for o in p.opts}
    assert {"-m", "--model", "-f", "--file", "-p", "--prompt", "-n", "--n-predict", "-c", "--ctx-size",
            "-t", "--threads"} <= run
    for path in ("ask", "chat"):
        opts = {o for p in command(path).params for o in p.opts}
        assert {"-m", "--model", "-n", "--n-predict", "-t", "--threads", "--prompt-format"} <= opts
        assert "--prompt" not in opts and "-p" not in opts  # the question is an argument, not a format
    for path in ("bench throughput", "bench niah", "bench context", "bench ppl"):
        assert "-n" not in {o for p in command(path).params for o in p.opts}  # -n is an answer's tokens


def test_an_option_value_that_looks_like_an_old_name_is_kept(capsys):
    """A value is never rewritten: `-p --ctx` asks the question "--ctx"."""
    params = parse("run", ["-f", "doc.txt", "-p", "--ctx", "--ctx-size", "256"])
    assert params["prompt"] == "--ctx" and params["ctx"] == 256
    assert capsys.readouterr().err == ""
    assert parse("ask", ["doc.txt", "--", "--prompt"])["args"] == ["doc.txt", "--prompt"]
