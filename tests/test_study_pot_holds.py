"""studies.pot_holds: what a saved context holds of one line, token by token, against what the
policy that saved it must hold: StreamingLLM keeps its sinks and the most recent cells, so a line read
long before the end is held by no (layer, KV head) pair and the last line by every pair; full attention
holds every token in every pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

from studies.pot_holds import find_line

EARLY = "# the code of the strongbox is 52445"
LAST = "# the code of the locker is 31337"
REPO = Path(__file__).resolve().parent.parent
SMOL_PAIRS = 4 * 3  # SmolLM2-135M cut to 4 blocks (conftest.py), 3 KV heads each


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    prose = [f"Entry {i}: the ferry left pier {i % 7} at {8 + i % 10} o'clock with {3 * i + 1} passengers aboard."
             for i in range(160)]
    lines = prose[:20] + [EARLY] + prose[20:] + [LAST]
    path = tmp_path_factory.mktemp("holds") / "doc.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _save(doc, model, policy: str, budget: str, folder):
    out = folder / f"{policy}.kvpot"
    res = run_cli("ask", str(doc), "What is the code of the locker?", "--model", str(model), "-P", policy,
                  "--budget", budget, "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1",
                  "--save-context", str(out))
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def streaming_ctx(doc, smollm2_cut_path, tmp_path_factory):
    return _save(doc, smollm2_cut_path, "streaming", "512", tmp_path_factory.mktemp("ctx"))


def _holds(ctx, find: str, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studies.pot_holds", str(ctx), "--find", find,
                           "--json", str(tmp_path / "holds.json"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # studies/ sits at the repository's top


def _rows(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "holds.json").read_text())["tokens"]


def test_streaming_holds_the_last_line_everywhere_and_an_early_one_nowhere(doc, streaming_ctx, tmp_path):
    ctx = streaming_ctx
    res = _holds(ctx, "strongbox", tmp_path, "--input", str(doc))
    assert res.returncode == 0, res.stderr
    early = _rows(tmp_path)
    assert EARLY.replace(" ", "") in "".join(r["piece"] for r in early).replace(" ", "")  # placed to the token
    assert [r["held_by"] for r in early] == [0] * len(early)
    res = _holds(ctx, "locker", tmp_path, "--input", str(doc))
    assert res.returncode == 0, res.stderr
    last = _rows(tmp_path)
    assert LAST.replace(" ", "") in "".join(r["piece"] for r in last).replace(" ", "")
    assert [r["held_by"] for r in last] == [SMOL_PAIRS] * len(last)
    assert "52445" not in res.stdout and "31337" in res.stdout.replace("'", "").replace(" ", "")


def test_full_attention_holds_every_token_in_every_pair(doc, smollm2_cut_path, tmp_path):
    ctx = _save(doc, smollm2_cut_path, "full", "8192", tmp_path)
    res = _holds(ctx, "strongbox", tmp_path, "--input", str(doc))
    assert res.returncode == 0, res.stderr
    rows = _rows(tmp_path)
    assert len(rows) >= 10 and all(r["held_by"] == SMOL_PAIRS for r in rows)
    # the rows are consecutive stream positions
    assert [r["pos"] for r in rows] == list(range(rows[0]["pos"], rows[0]["pos"] + len(rows)))


def test_a_changed_input_or_missing_text_is_one_line(doc, streaming_ctx, tmp_path):
    ctx = streaming_ctx
    res = _holds(ctx, "no such words", tmp_path, "--input", str(doc))
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "is not in the inputs")
    changed = tmp_path / "changed.txt"
    changed.write_text(doc.read_text().replace("Entry", "An entry written again"))
    res = _holds(ctx, "strongbox", tmp_path, "--input", str(changed))
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "no longer tokenizes as it was read")


@pytest.mark.parametrize("pieces, needle, line", [
    (["ab\ncd", "ef gh\nij"], "de", "cdef gh"),        # split between pieces
    (["ab\ncd", "ef gh", "x\nij"], "gh", "cdef ghx"),  # the line's end in a later piece
    (["ab\ncdef"], "ef", "cdef"),                      # the last line, no newline after it
])
def test_find_line(pieces, needle, line):
    text, a, b = find_line(iter(pieces), needle)
    assert text[a:b] == line
