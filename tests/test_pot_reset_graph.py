"""After a method's part is removed and the pot reset, the next decode builds a new graph: llama.cpp's
last graph still holds the part's nodes, whose weights are freed, so reusing it read freed memory (a
segfault after Locret's heads, EdgeInfinite's gate or the QKV capture, found by tests/pot_check). The
logits after the reset must be a fresh context's, bit for bit. Run in a subprocess (reset_worker.py)
so that a crash fails the test rather than pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("reset_worker.py")


@pytest.mark.parametrize("part", ["heads", "capture", "gate"])
def test_decode_after_removing_a_part_and_resetting_builds_a_new_graph(part, smollm2_path):
    run = subprocess.run([sys.executable, str(WORKER), str(smollm2_path), part],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert float(run.stdout.strip().splitlines()[-1]) == 0.0
