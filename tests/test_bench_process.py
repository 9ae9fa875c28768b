"""How a benchmark case's child process is stopped (kvpot.bench.process): SIGTERM first, so that a save it
is writing removes its temporary file, and SIGKILL only for a child that does not end."""

from __future__ import annotations

import subprocess
import sys
import time

from kvpot.bench.process import _stop

# a child that says it is ready, then waits; on SIGTERM it writes its last words (what a save's handler does)
_CHILD = """
import signal, sys, time
def on_term(*_):
    open(sys.argv[1], "w").write("cleaned up")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term if sys.argv[2] == "handles" else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _child(tmp_path, mode: str) -> tuple[subprocess.Popen, object]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc, marker


def test_a_case_is_told_to_end_before_it_is_killed(tmp_path):
    proc, marker = _child(tmp_path, "handles")
    _stop(proc)
    assert proc.returncode == 143 and marker.read_text() == "cleaned up"


def test_a_case_that_does_not_end_is_killed_after_the_grace(tmp_path):
    proc, marker = _child(tmp_path, "ignores")
    t0 = time.monotonic()
    _stop(proc, grace=0.5)
    assert proc.returncode == -9 and not marker.exists() and time.monotonic() - t0 < 30
