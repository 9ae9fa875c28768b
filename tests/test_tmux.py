"""One real terminal session under tmux: the progress bar shows while reading, `chat` answers two
questions, /save writes the context, and a second process that reopens it computes the same
next-token logits for the next question as the first process did."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from kvpot.sample import logbook

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

ARGS = ["--model", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "12", "--prompt", "completion",
        "--threads", "2"]
KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_for(session: str, predicate, timeout: float = 300, seen: list | None = None) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        screen = _tmux("capture-pane", "-p", "-t", session, "-S", "-200")
        if seen is not None:
            seen.append(screen)
        if predicate(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"timed out; screen:\n{screen}")


def test_chat_in_a_real_terminal_then_reopen(tmp_path, smollm2_path):
    text, question, _ = logbook()
    doc = tmp_path / "logbook.txt"
    doc.write_text(text)
    ctx, d1, d2 = tmp_path / "chat.kvctx", tmp_path / "first", tmp_path / "second"
    d1.mkdir()
    d2.mkdir()
    name = f"kvpot-test-{id(tmp_path)}"
    cmd = " ".join(shlex.quote(c) for c in [*KVPOT, "chat", str(doc), *ARGS])
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "50",
          f"env KVPOT_SAVE_LOGITS={shlex.quote(str(d1))} {cmd}; sleep 600")
    try:
        screens: list[str] = []
        _wait_for(name, lambda s: "you>" in s, seen=screens)
        bar = [s for s in screens if "reading" in s and "tok/s" in s and "━" in s and "compactions" in s]
        assert bar, "the progress bar never showed"

        def ask(line: str, n_prompts: int) -> str:
            _tmux("send-keys", "-t", name, "-l", line)
            _tmux("send-keys", "-t", name, "Enter")
            return _wait_for(name, lambda s: s.count("you>") >= n_prompts)

        ask(question, 2)
        ask("Who mended the foresail?", 3)
        screen = ask(f"/save {ctx}", 4)
        assert "context saved" in screen
        follow_up = "Which day was the strongbox code set?"
        ask(follow_up, 5)
        _tmux("send-keys", "-t", name, "-l", "/quit")
        _tmux("send-keys", "-t", name, "Enter")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    first = np.load(d1 / "turn-3.npy")

    res = subprocess.run([*KVPOT, "ask", "--context", str(ctx), follow_up], capture_output=True, text=True,
                         env={**__import__("os").environ, "KVPOT_SAVE_LOGITS": str(d2)}, timeout=300)
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(np.load(d2 / "turn-3.npy"), first)
