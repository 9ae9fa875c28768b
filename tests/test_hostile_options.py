"""Options that cannot work are refused before reading, with messages whose numbers are true:
IMDC takes only pruners that keep within the budget it hands them (every pruner it accepts is run
through its schedule here and checked step by step), and full attention's "does not fit" names the
input's exact token count when it was counted to the end, a lower bound only when counting stopped."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.policies import IMDC, POLICIES, LengthAware, PotView, build_policy, make_policy
from kvpot.session.reading_plan import MAX_BYTES_PER_TOKEN, count_tokens

runner = CliRunner()
L, H = 3, 2
PRUNERS = [name for name in POLICIES if name != IMDC.name]


def _accepted(name: str) -> bool:
    try:
        make_policy(f"imdc:pruner={name}")
    except KvpotError:
        return False
    return True


def _feed(spec: str, n_tokens: int, budget: int, chunk: int) -> list[tuple[int, int]]:
    """The engine's loop without a model (chunk, after_chunk, wants_compaction, select, compact) with
    random scores: (cells held after the step, the step's budget) for every step."""
    rng = np.random.default_rng(0)
    policy = build_policy(spec, budget, chunk)
    LengthAware.of(policy).set_expected_length(n_tokens)  # what the engine tells a policy as it starts
    positions = np.zeros((L, H, 0), dtype=np.int64)
    read, step, held = 0, 0, []
    while read < n_tokens:
        size = min(max(1, policy.chunk_size(step, chunk)), n_tokens - read)
        new = np.arange(read, read + size, dtype=np.int64)
        positions = np.concatenate([positions, np.broadcast_to(new, (L, H, size))], axis=2)
        read += size
        n = positions.shape[2]
        view = PotView(n_layer=L, n_head_kv=H, n_cells=n, positions=positions,
                       scores=rng.random((L, H, n), dtype=np.float32), logprobs=-rng.random(size, dtype=np.float32),
                       chunk_positions=new, tokens_seen=read, head_scores=rng.random((L, H, size), dtype=np.float32))
        policy.after_chunk(view)
        step_budget = int(policy.budget_at(step, budget))
        next_size = min(policy.chunk_size(step + 1, chunk), n_tokens - read)
        if policy.wants_compaction(n, step_budget, next_size):
            keep = policy.select(view, step_budget)
            assert keep is not None, f"{spec}: asked to compact, kept every cell"
            positions = np.take_along_axis(positions, keep, axis=-1)
            policy.after_compaction(keep)
        held.append((positions.shape[2], step_budget))
        step += 1
    return held


def test_imdc_refuses_every_pruner_that_cannot_keep_within_its_budget():
    refused = [name for name in PRUNERS if not _accepted(name)]
    assert "full" in refused
    for name in refused:
        with pytest.raises(KvpotError, match=f"^imdc: pruner {name} .*choose a pruner that drops cells"):
            make_policy(f"imdc:pruner={name}")


@pytest.mark.parametrize("name", [name for name in PRUNERS if _accepted(name)])
def test_every_pruner_imdc_accepts_holds_to_its_budget(name):
    budget = 256
    held = _feed(f"imdc:pruner={name},m_0=64", n_tokens=2000, budget=budget, chunk=128)
    assert len(held) > 4  # several steps, each over its budget before it compacted
    for cells, step_budget in held:
        assert cells <= step_budget <= budget  # IMDC's m_i after every step, never more than --budget


def test_imdc_with_full_is_refused_before_reading(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("a line of text\n" * 50)
    res = runner.invoke(app, ["ask", str(doc), "Q", "--policy", "imdc:pruner=full", "--budget", "64"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "imdc: pruner full keeps every cell it reads")


def _stated_tokens(stderr: str) -> tuple[int, bool]:
    m = re.search(r"the input is (more than )?([\d,]+) tokens", stderr)
    assert m, stderr
    return int(m.group(2).replace(",", "")), m.group(1) is None


def test_full_attention_too_small_context_says_the_exact_count(tmp_path, smollm2_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The keeper counts the ships that pass the lighthouse at night.\n" * 14)
    assert doc.stat().st_size <= 64 * MAX_BYTES_PER_TOKEN  # small enough to be counted to its end
    exact = count_tokens(read_model_facts(smollm2_path), "auto", collect_sources([str(doc)]), 10**6)
    assert exact > 64
    res = run_cli("run", "-f", str(doc), "-p", "Q", "-m", str(smollm2_path), "-c", "64")
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "full attention keeps every token")
    assert _stated_tokens(res.stderr) == (exact, True)


def test_full_attention_counting_stopped_says_a_true_lower_bound(tmp_path, smollm2_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The keeper counts the ships that pass the lighthouse at night.\n" * 60)
    whole = count_tokens(read_model_facts(smollm2_path), "auto", collect_sources([str(doc)]), 10**6)
    res = run_cli("run", "-f", str(doc), "-p", "Q", "-m", str(smollm2_path), "-c", "64")
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "(counting stopped there)")
    stated, exact = _stated_tokens(res.stderr)
    assert not exact and stated < whole
