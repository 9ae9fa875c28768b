"""ask and chat without -m: the most capable downloaded model the device holds (kvpot/session/default_model.py).

The machine's memory is given (a DeviceMemory, or KVPOT_DEVICE_MEMORY for the command), and which models
are "downloaded" is a kvpot home holding links to the test models' files, so the choice is the same on
every machine. What each model needs is computed by the --budget auto cost model from its GGUF facts."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_model_facts
from kvpot.models.registry import GEMMA3_270M, KNOWN, QWEN25_CODER_05B, QWEN25_CODER_15B, SMOLLM2_135M
from kvpot.session import default_model as choose
from kvpot.session.auto_budget import DeviceMemory

GIB = 1 << 30


@pytest.fixture
def home(tmp_path, monkeypatch, smollm2_path, gemma_path, qwen05_path):
    """A kvpot home where the three test models are downloaded and the 1.5B model is not."""
    models = tmp_path / "models"
    models.mkdir()
    for model, path in ((SMOLLM2_135M, smollm2_path), (GEMMA3_270M, gemma_path), (QWEN25_CODER_05B, qwen05_path)):
        (models / model.filename).symlink_to(path)
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    monkeypatch.delenv(choose.MODEL_ENV, raising=False)
    return tmp_path


def cells(model, free: int) -> int:
    return choose.cells_held(model, DeviceMemory(free, "RAM"))


def least_memory_for(model) -> int:
    """The least memory (to 16 MiB) in which `model` has a useful pot, found with the cost model itself."""
    lo, hi = 256 << 20, 64 * GIB
    while hi - lo > 16 << 20:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cells(model, mid) >= choose.USEFUL_CELLS else (mid, hi)
    return hi


@pytest.fixture(autouse=True)
def facts_read_once(monkeypatch):
    """The GGUF facts of each file read once for the test (a read parses the vocabulary: ~1.5 s)."""
    monkeypatch.setattr(choose, "read_model_facts", functools.cache(read_model_facts))


def test_registry_ranks_and_sizes_are_consistent():
    ranks = [m.rank for m in KNOWN.values()]
    assert len(set(ranks)) == len(ranks)  # a strict order: the choice never depends on dict order
    assert choose.by_capability()[0] is QWEN25_CODER_15B
    assert all(m.size_bytes > 0 and m.expect for m in KNOWN.values())


def test_known_sizes_match_the_files(smollm2_path, gemma_path, qwen05_path):
    for model, path in ((SMOLLM2_135M, smollm2_path), (GEMMA3_270M, gemma_path), (QWEN25_CODER_05B, qwen05_path)):
        assert path.stat().st_size == model.size_bytes, model.name


def test_plenty_of_memory_picks_the_best_downloaded_and_names_the_better_one(home):
    pick = choose.choose_default(DeviceMemory(16 * GIB, "RAM"))
    assert pick.name == QWEN25_CODER_05B.name
    assert pick.better == QWEN25_CODER_15B.name  # not downloaded, and 16 GiB would hold it
    lines: list[str] = []
    assert choose.default_model(DeviceMemory(16 * GIB, "RAM"), say=lines.append) == QWEN25_CODER_05B.name
    assert lines[0].startswith(f"model: {QWEN25_CODER_05B.name}")
    assert f"kvpot pull {QWEN25_CODER_15B.name}" in lines[1]


def test_a_model_without_room_for_a_useful_pot_is_passed_over(home):
    free = least_memory_for(QWEN25_CODER_05B)
    assert choose.choose_default(DeviceMemory(free, "RAM")).name == QWEN25_CODER_05B.name
    below = free - (16 << 20)
    assert cells(QWEN25_CODER_05B, below) < choose.USEFUL_CELLS
    # the next one down in capability that has room there (Gemma's 262K-entry vocabulary makes its NuC
    # logits larger than the 0.5B model's, so that can be SmolLM2)
    expected = next(m for m in (GEMMA3_270M, SMOLLM2_135M) if cells(m, below) >= choose.USEFUL_CELLS)
    assert choose.choose_default(DeviceMemory(below, "RAM")).name == expected.name


def test_no_room_for_any_model_is_one_clear_refusal(home):
    free = min(least_memory_for(m) for m in (SMOLLM2_135M, GEMMA3_270M, QWEN25_CODER_05B)) - (16 << 20)
    with pytest.raises(KvpotError, match=f"no downloaded model fits the {free / GIB:.1f} GiB free"):
        choose.choose_default(DeviceMemory(free, "RAM"))


def test_nothing_downloaded_names_the_model_to_pull(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    with pytest.raises(KvpotError, match=f"no model is downloaded yet; run `kvpot pull {QWEN25_CODER_15B.name}`"):
        choose.choose_default(DeviceMemory(16 * GIB, "RAM"))
    # a phone with 1 GiB free: the 1.5B model's file alone would not fit, so the suggestion is smaller
    with pytest.raises(KvpotError, match=f"run `kvpot pull {GEMMA3_270M.name}`"):
        choose.choose_default(DeviceMemory(1 * GIB, "RAM"))


def test_the_environment_variable_wins_and_says_nothing(home, monkeypatch):
    monkeypatch.setenv(choose.MODEL_ENV, SMOLLM2_135M.name)
    lines: list[str] = []
    assert choose.default_model(DeviceMemory(16 * GIB, "RAM"), say=lines.append) == SMOLLM2_135M.name
    assert lines == []


@pytest.mark.parametrize("command", ["ask", "run"])
def test_a_command_without_a_model_says_which_it_chose(home, tmp_path, command):
    """ask and run end to end, on a pretended device too small for the 0.5B model: stderr names the
    model chose_default picks there (a short document, read with full attention, so the test stays fast)."""
    doc = tmp_path / "doc.txt"
    doc.write_text("The harbour master keeps the key in a blue tin.\n" * 20)
    env = {k: v for k, v in os.environ.items() if k != choose.MODEL_ENV}
    free = least_memory_for(QWEN25_CODER_05B) - (16 << 20)
    expected = choose.choose_default(DeviceMemory(free, "RAM")).name
    assert expected != QWEN25_CODER_05B.name
    env.update(KVPOT_HOME=str(home), KVPOT_DEVICE_MEMORY=str(free))
    args = {"ask": ["ask", str(doc), "Where is the key?"], "run": ["run", "-f", str(doc), "-p", "Where is the key?"]}
    res = subprocess.run([sys.executable, "-c", "from kvpot.cli.main import main; main()", *args[command],
                          "-n", "8"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert f"model: {expected} " in res.stderr


def test_run_help_says_the_default_model():
    from typer.testing import CliRunner

    from kvpot.cli.main import app

    shown = " ".join(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "the most capable downloaded" in shown and "$KVPOT_MODEL" in shown
