"""KVPOT_PROGRESS_EVERY: the interval between reading's progress lines in a log or a pipe (5 seconds
unless set; 0 gives one after every chunk), refused in one line before the model loads when it is not
a number of seconds."""

from __future__ import annotations

import pytest
from conftest import run_cli

from cli.reading import EVERY_ENV, PLAIN_EVERY_S, plain_every_s
from kvpot.errors import KvpotError


@pytest.mark.parametrize("text, expected", [(None, PLAIN_EVERY_S), ("", PLAIN_EVERY_S), ("0", 0.0),
                                            ("2.5", 2.5), (" 60 ", 60.0)])
def test_the_interval(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv(EVERY_ENV, raising=False)
    else:
        monkeypatch.setenv(EVERY_ENV, text)
    assert plain_every_s() == expected


@pytest.mark.parametrize("text", ["x", "-1", "nan", "inf", "5s"])
def test_what_is_not_seconds_is_refused(monkeypatch, text):
    monkeypatch.setenv(EVERY_ENV, text)
    with pytest.raises(KvpotError, match=f"^{EVERY_ENV} must be a number of seconds"):
        plain_every_s()


def test_every_chunk_gives_a_line_per_chunk(tmp_path, smollm2_cut_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The tide came in over the grey stones and went out again. " * 120)
    args = ["ask", str(doc), "What came in?", "-m", str(smollm2_cut_path), "--budget", "256", "--chunk", "64",
            "-n", "2", "--prompt-format", "completion", "--threads", "2"]
    every = run_cli(*args, env={EVERY_ENV: "0"})
    assert every.returncode in (0, 5), every.stderr
    lines = _progress_lines(every.stderr)
    counts = [int(ln.split()[1].replace(",", "")) for ln in lines]
    steps = [b - a for a, b in zip([0, *counts], counts)]
    assert len(counts) > 10 and all(0 < step <= 64 for step in steps), every.stderr
    default = run_cli(*args)
    assert len(_progress_lines(default.stderr)) < len(lines), default.stderr


def _progress_lines(stderr: str) -> list[str]:
    """The document read's progress lines (up to its summary: a focused read may follow)."""
    out = []
    for ln in stderr.splitlines():
        if ln.startswith("read ") and " tokens in " in ln:
            break
        if ln.startswith("read ") and " tok/s, pot " in ln:
            out.append(ln)
    return out


def test_a_bad_interval_is_one_line_before_the_model_loads(tmp_path, smollm2_cut_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("A short note.\n")
    r = run_cli("ask", str(doc), "What is it?", "-m", str(smollm2_cut_path), env={EVERY_ENV: "soon"})
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith(f"{EVERY_ENV} must be a number of seconds (0 or more), got 'soon'")
    assert "loading" not in r.stderr and "Traceback" not in r.stderr
