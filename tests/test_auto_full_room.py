"""`--budget auto` reads with full attention every input that full attention can read: the document
plus the answer's room, with no chunk of reading room on top (full attention never distills). Before,
inputs within a chunk of the limit (SmolLM2: 7,233-7,744 tokens of its 8K) went through the pot and
were distilled, although stock llama.cpp reads them whole (issue 17, point 4); on stdin, whose length
is unknown until it ends, they went to the pot until stdin was read ahead."""

from __future__ import annotations

import pytest
from test_auto_budget import OPTS, stock_answer
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.auto_budget import (
    MARGIN_MIN,
    MEMORY_ENV,
    DeviceMemory,
    compute_bytes,
    global_kv_bytes_per_cell,
    plan_cells,
    window_kv_bytes,
)
from kvpot.session.reading_plan import count_tokens
from kvpot.session.session import answer_reserve
from kvpot.session.settings import RunSettings

CHUNK = 256  # OPTS' --chunk


def free_bytes_for(facts, cells: int) -> int:
    """Free memory in which the device plan holds exactly `cells` (margin at its floor, under 2 GiB)."""
    # a step's attention over each cell with flash attention, which `auto` turns on for a device that cannot
    # hold the model's window without it: the f16 mask's column
    per_cell = global_kv_bytes_per_cell(facts) + CHUNK * 2
    fixed = window_kv_bytes(facts, CHUNK) + compute_bytes(facts, 0, CHUNK, CHUNK, True)  # InfiniPot's NuC: every row
    return MARGIN_MIN + facts.file_bytes + fixed + cells * per_cell


@pytest.mark.parametrize("via", ["file", "stdin"])
def test_an_input_within_a_chunk_of_the_limit_is_read_whole_as_stock(via, tmp_path, smollm2_path, monkeypatch):
    text, question, _ = logbook(n_entries=24)  # about 1K tokens
    path = tmp_path / "logbook.txt"
    path.write_text(text)
    facts = read_model_facts(smollm2_path)
    doc = count_tokens(facts, "completion", collect_sources([str(path)]), 10**6)
    reserve = answer_reserve(RunSettings(chunk=CHUNK, max_tokens=10))
    cells = doc + reserve  # room for the document and the answer, not for another chunk
    free = free_bytes_for(facts, cells)
    assert free < 2 << 30 and plan_cells(facts, DeviceMemory(free, MEMORY_ENV), CHUNK, CHUNK, flash_attn=True).cells == cells
    monkeypatch.setenv(MEMORY_ENV, str(free))
    # stdin has no size: it is read ahead to its end (it is within the limit) and counted as the file is
    # -v: the plan's reasons (without it, one line says what they come to)
    res = (runner.invoke(app, ["ask", str(path), question, *OPTS, "-v"]) if via == "file" else
           runner.invoke(app, ["ask", "-", question, *OPTS, "-v"], input=text))
    assert res.exit_code == 0, res.output
    assert f"the input's {doc:,} tokens fit the {cells:,} cells" in res.stderr
    assert "full attention, as stock llama.cpp" in res.stderr
    assert f" · {doc:,} tokens · fits the 8K window: reading it whole" in res.stderr
    assert res.stdout.rstrip("\n") == stock_answer(smollm2_path, text, question, 10, flash_attn=True)


runner = CliRunner()
