"""A budget a policy can never work with is refused up front, in one line, before the model loads
or anything is read; it used to surface only at the policy's first compaction.

Unit part: each policy's `check_budget` refuses exactly the budgets its `select` would refuse
(the smallest working budget it names is accepted, the one below is not). CLI part: every policy
with an impossible budget, through ask, run and bench; the input is a FIFO nobody writes to and
the model a path that does not exist, so any reading or loading would hang or fail differently."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.policies import (
    H2O,
    IMDC,
    POLICIES,
    BudgetTooSmall,
    EdgeInfinite,
    FullAttention,
    InfiniPot,
    InfLLM,
    Locret,
    SnapKV,
    StreamingLLM,
    Truncate,
)
from kvpot.policies.base import PotView
from kvpot.session.checks import check_budget

# policy -> (its smallest working budget, or None when every budget of at least 1 cell works)
LEAST = {
    "full": (FullAttention(), None),
    "truncate": (Truncate(), 1),
    "streaming": (StreamingLLM(n_sink=9), 10),
    "snapkv": (SnapKV(window=8), 9),
    "h2o": (H2O(), 1),
    "infinipot": (InfiniPot(), 10),  # |C| = budget // 2 must hold the 4 sinks and one more; sized by fit
    "imdc": (IMDC(SnapKV(window=8), m_max=64), 9),  # each step's budget goes to its pruner
    "locret": (Locret(heads="heads.gguf", n_s=8), 9),
    "edgeinfinite": (EdgeInfinite(gate="gate.gguf", L_sink=4, L_window=8, L_seg=16), 28),
    "infllm": (InfLLM(), None),  # sized by fit from the budget; its parts are refused there (test_infllm)
}


def test_every_registered_policy_is_covered():
    assert set(LEAST) == set(POLICIES)


def _view(n_cells: int) -> PotView:
    rng = np.random.default_rng(0)
    positions = np.broadcast_to(np.arange(n_cells), (2, 2, n_cells)).copy()
    return PotView(n_layer=2, n_head_kv=2, n_cells=n_cells, positions=positions,
                   scores=rng.random((2, 2, n_cells), dtype=np.float32), logprobs=None,
                   chunk_positions=np.arange(n_cells - 4, n_cells), tokens_seen=n_cells,
                   head_scores=rng.random((2, 2, 4), dtype=np.float32))


@pytest.mark.parametrize("name", sorted(LEAST))
def test_check_budget_refuses_what_select_would(name):
    policy, least = LEAST[name]
    if least is None:
        policy.check_budget(1)
        return
    policy.check_budget(least)
    with pytest.raises(BudgetTooSmall) as e:
        policy.check_budget(least - 1)
    assert e.value.least == least and "\n" not in str(e.value)
    if isinstance(policy, InfiniPot):  # sized by fit, as the engine calls it: fit refuses with the same line
        with pytest.raises(BudgetTooSmall, match=re.escape(str(e.value))):
            copy.deepcopy(policy).fit(least - 1, 4)
        fitted = copy.deepcopy(policy)
        fitted.fit(least, 4)
        assert fitted.select(_read_chunk(fitted), fitted.budget_at(0, least)) is not None
        return
    # the policy's own selection refuses the same budget, with the same line
    with pytest.raises(BudgetTooSmall, match=re.escape(str(e.value).split("(")[0])):
        policy.select(_read_chunk(policy), least - 1)
    assert policy.select(_read_chunk(policy), least) is not None


def _read_chunk(policy) -> PotView:
    """A pot of 64 cells whose last 4 the policy has just read, as the engine hands it over."""
    view = _view(64)
    policy.reset()
    policy.before_chunk(4)
    policy.after_chunk(view)
    return view


def test_imdc_checks_its_pruner_at_m_max_and_at_m_0():
    with pytest.raises(BudgetTooSmall, match=r"m_max \(8\) is too small for its pruner snapkv, which needs at least 9"):
        IMDC(SnapKV(window=8), m_max=8).fit(1024, 512)
    imdc = IMDC(SnapKV(window=32), m_max=1024, chunk=512)
    imdc.fit(1024, 512)  # the input's length is not known yet: m_max alone
    imdc.set_expected_length(16 * 512)  # 16 chunks: m_0 = 64
    assert imdc.schedule()[0][1] == 64
    imdc.set_expected_length(40 * 512)  # the paper's m_0 = 1024 // 40 = 25 is not more than the window: 33
    assert imdc.schedule()[0][1] == 33
    told = IMDC(SnapKV(window=32), m_max=1024, chunk=512, m_0=25)  # an m_0 the user set is theirs: refused
    told.fit(1024, 512)
    with pytest.raises(BudgetTooSmall, match=r"over 40 chunks .* as few as 25 cells.*needs at least 33.*m_0=33"):
        told.set_expected_length(40 * 512)
    with pytest.raises(BudgetTooSmall, match=r"as few as 25 cells"):  # what the CLI runs, with the input's estimate
        check_budget("imdc:pruner=snapkv,m_max=1024,chunk=512,m_0=25", 1024, 512, expected_tokens=40 * 512)
    check_budget("imdc:pruner=snapkv,m_max=1024,chunk=512", 1024, 512, expected_tokens=40 * 512)


def test_the_settings_check_names_the_option_and_the_least_budget():
    with pytest.raises(BudgetTooSmall, match=r"window \(32\).*; raise --budget to at least 33$"):
        check_budget("snapkv", 32, 512)
    with pytest.raises(BudgetTooSmall, match=r"; raise budget in config\.toml to at least 9$"):
        check_budget("streaming:n_sink=8", 8, 512, option="budget in config.toml")


# -- the CLI: refused before loading or reading ----------------------------------------------------

NO_MODEL = "/nonexistent/model.gguf"
# (policy, budget, what the line says): one case per registered policy, and then some
ASK_CASES = [
    ("full", "8", "the pot needs at least 16 cells"),
    ("truncate", "8", "the pot needs at least 16 cells"),
    ("h2o", "8", "the pot needs at least 16 cells"),
    ("infinipot", "8", "the pot needs at least 16 cells"),
    ("infinipot:pot=64,keep=64", "64", "keep (|C| = 64) must be at least 1 and below pot"),
    ("snapkv", "32", "raise --budget to at least 33"),
    ("snapkv:window=100", "64", "raise --budget to at least 101"),
    ("streaming:n_sink=64", "64", "raise --budget to at least 65"),
    ("locret:heads=missing.gguf,n_s=64", "64", "raise --budget to at least 65"),
    ("imdc:pruner=snapkv,m_max=32", "1024", "m_max (32) is too small for its pruner snapkv"),
    ("imdc:pruner=streaming,m_max=4", "1024", "m_max (4) is too small for its pruner streaming"),
]


@pytest.fixture
def silent_fifo(tmp_path):
    """An input nobody writes to: opening it to read would block until the test's timeout."""
    path = tmp_path / "doc.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("policy,budget,needle", ASK_CASES, ids=[f"{p}@{b}" for p, b, _ in ASK_CASES])
def test_ask_refuses_an_impossible_budget_before_reading(policy, budget, needle, silent_fifo, tmp_path):
    res = run_cli("ask", silent_fifo, "q?", "-m", NO_MODEL, "-P", policy, "--budget", budget,
                  env={"KVPOT_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, needle)
    assert res.stdout == ""


def test_a_budget_from_the_config_file_is_named_as_such(silent_fifo, tmp_path):
    (tmp_path / "config.toml").write_text('[defaults]\npolicy = "snapkv"\nbudget = 20\n')
    res = run_cli("ask", silent_fifo, "q?", "-m", NO_MODEL, env={"KVPOT_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "raise budget in ")
    assert "to at least 33" in res.stderr


def test_imdc_m_0_is_checked_against_the_input_before_reading(smollm2_path, tmp_path):
    """IMDC's first step keeps m_0 cells: one set too small for a long input leaves SnapKV less than its
    window (the default rises to the window itself). Said after the input's size is known, before the
    model loads."""
    doc = tmp_path / "long.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 2000)  # ~90 KB: ~44 chunks of 512
    res = run_cli("ask", str(doc), "q?", "-m", str(smollm2_path), "-P", "imdc:pruner=snapkv,m_0=20", "--budget", "1024",
                  "--chunk", "512", env={"KVPOT_HOME": str(tmp_path)}, timeout=120)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "too few for its pruner snapkv, which needs at least 33")


def test_run_refuses_an_impossible_budget_before_reading(silent_fifo, tmp_path):
    res = run_cli("run", "-f", silent_fifo, "-p", "q?", "-m", NO_MODEL, "-P", "streaming:n_sink=16", "--budget", "16",
                  env={"KVPOT_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "raise --budget to at least 17")


@pytest.mark.parametrize("bench", [["niah", "--length", "1024"], ["ppl", "-f", "{fifo}"], ["throughput"]])
def test_bench_refuses_an_impossible_budget_before_any_run(bench, silent_fifo, tmp_path):
    args = [a.replace("{fifo}", silent_fifo) for a in bench]
    res = run_cli("bench", *args, "-m", NO_MODEL, "-P", "snapkv", "--budget", "16",
                  env={"KVPOT_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "raise --budget to at least 33")


ADAPTERS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize(("model", "spec", "needle"), [
    ("smollm2", f"locret:heads={ADAPTERS / 'gemma3-270m.locret.gguf'}", "was made for"),
    ("gemma", f"edgeinfinite:gate={ADAPTERS / 'smollm2-135m.edgeinfinite.gguf'}", "was made for"),
])
def test_bench_refuses_a_foreign_adapter_before_any_run(model, spec, needle, silent_fifo, tmp_path,
                                                                    request):
    """The adapter is checked against the model before the benchmark reads its file (a FIFO nobody writes
    to: reading it would block until the timeout) or measures stock llama.cpp."""
    model_path = request.getfixturevalue(f"{'smollm2' if model == 'smollm2' else 'gemma'}_path")
    res = run_cli("bench", "ppl", "-f", silent_fifo, "-m", str(model_path), "-P", "streaming", "-P", spec,
                  "--budget", "1024", env={"KVPOT_HOME": str(tmp_path)}, timeout=120)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, needle)
