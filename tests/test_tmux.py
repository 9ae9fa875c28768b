"""One real terminal session under tmux (its own server, on its own socket, with the environment
passed explicitly, so a tmux server the user already runs plays no part): the progress bar shows while reading, `chat` answers two
questions, /save writes the context, and a second process that reopens it computes the same
next-token logits for the next question as the first process did."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from kvpot.bench.logbook import logbook

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

ARGS = ["--model", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "12", "--prompt-format", "completion",
        "--threads", "2"]
KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]


@pytest.fixture
def tmux_socket(tmp_path):
    """A private tmux server: -S names its socket; it is killed at the end."""
    sock = tmp_path / "tmux.sock"
    yield sock
    subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True)


_SOCKET: list = []


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-S", str(_SOCKET[-1]), "-f", "/dev/null", *args], capture_output=True, text=True,
                          check=True).stdout


def _wait_for(session: str, predicate, timeout: float = 1800, seen: list | None = None) -> str:
    # a guard against a hang, not a speed check: a 2-core machine shared with other test runs is slow
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        screen = _tmux("capture-pane", "-p", "-t", session, "-S", "-200")
        if seen is not None:
            seen.append(screen)
        if predicate(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"timed out; screen:\n{screen}")


def _env_prefix() -> str:
    """What the pane's process needs, given explicitly: a server started elsewhere would otherwise
    hand it that server's environment (another KVPOT_HOME, another PATH)."""
    keep = {k: os.environ[k] for k in ("KVPOT_HOME", "XDG_CACHE_HOME", "HOME", "PATH", "LANG", "LC_ALL")
            if k in os.environ}
    return "env -i " + " ".join(f"{k}={shlex.quote(v)}" for k, v in {**keep, "TERM": "xterm-256color"}.items())


def test_chat_in_a_real_terminal_then_reopen(tmp_path, smollm2_path, tmux_socket):
    _SOCKET.append(tmux_socket)
    text, question, _ = logbook()
    doc = tmp_path / "logbook.txt"
    doc.write_text(text)
    ctx, d1, d2 = tmp_path / "chat.kvctx", tmp_path / "first", tmp_path / "second"
    d1.mkdir()
    d2.mkdir()
    name = f"kvpot-test-{id(tmp_path)}"
    # the server starts with another kvpot home, as one started earlier from another shell would:
    # the pane must not depend on it
    subprocess.run(["tmux", "-S", str(tmux_socket), "-f", "/dev/null", "new-session", "-d", "-s", "earlier", "sleep 600"],
                   check=True, env={**os.environ, "KVPOT_HOME": str(tmp_path / "another-home")})
    cmd = " ".join(shlex.quote(c) for c in [*KVPOT, "chat", str(doc), *ARGS, "--locator", "pot"])
    _tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "50",
          f"{_env_prefix()} KVPOT_SAVE_LOGITS={shlex.quote(str(d1))} {cmd}; sleep 600")
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
        subprocess.run(["tmux", "-S", str(tmux_socket), "kill-session", "-t", name], capture_output=True)
    first = np.load(d1 / "turn-3.npy")

    res = subprocess.run([*KVPOT, "ask", "--context", str(ctx), follow_up], capture_output=True, text=True,
                         env={**os.environ, "KVPOT_SAVE_LOGITS": str(d2)}, timeout=300)
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(np.load(d2 / "turn-3.npy"), first)
