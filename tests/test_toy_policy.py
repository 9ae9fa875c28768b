"""Adding a method touches its own file plus the registry: tests/toy_policy.py, registered here by one
`register_policy` call, is taken by every place that lists or checks policies (the help, the settings,
the budget check, `kvpot ask`) and reads a document through the Engine on the test models like any
shipped policy."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import toy_policy
from toy_policy import EveryNth
from typer.testing import CliRunner

import kvpot.policies
from kvpot.bench.logbook import logbook
from kvpot.cli._options import policy_names
from kvpot.cli.main import app
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import BudgetTooSmall, StreamingLLM, make_policy, register_policy
from kvpot.policies.base import FORWARDED, Policy
from kvpot.session import session as session_module
from kvpot.session.checks import check_budget
from kvpot.session.settings import RunSettings

BUDGET, CHUNK, STRIDE = 64, 32, 3


@pytest.fixture
def registry(monkeypatch):
    """The registry with the toy added, for this test alone (the shipped list is checked elsewhere)."""
    monkeypatch.setattr(kvpot.policies, "POLICIES", dict(kvpot.policies.POLICIES))
    register_policy(EveryNth)
    return kvpot.policies.POLICIES


def toy_rule(held: list[int], budget: int, stride: int) -> list[int]:
    """EveryNth's choice, restated: multiples of stride newest first, then the rest newest first."""
    ranked = sorted(held, key=lambda p: (p % stride != 0, -p))
    return sorted(ranked[:budget])


def test_the_registry_builds_the_toy_from_a_spec(registry):
    assert registry["every_nth"] is EveryNth
    assert make_policy("every_nth:stride=3") == EveryNth(stride=3)
    with pytest.raises(KvpotError, match="every_nth has no parameter 'window'"):
        make_policy("every_nth:window=3")


def test_register_policy_refuses_a_taken_or_unspellable_name(registry):
    register_policy(EveryNth)  # the same class again: nothing changes
    assert registry["every_nth"] is EveryNth
    taken = type("Taken", (EveryNth,), {"name": "streaming"})
    with pytest.raises(KvpotError, match="'streaming' is taken by StreamingLLM"):
        register_policy(taken)
    assert registry["streaming"] is StreamingLLM
    with pytest.raises(KvpotError, match="lowercase letters"):
        register_policy(type("Spaced", (EveryNth,), {"name": "every nth"}))
    with pytest.raises(KvpotError, match="Policy subclass"):
        register_policy(int)


def test_the_toy_is_only_its_own_file():
    """The toy's module defines one Policy subclass that overrides core hooks alone and imports nothing of
    kvpot but the base module and the errors: no capability to declare, no table to add a row to."""
    tree = ast.parse(Path(toy_policy.__file__).read_text())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert [c.name for c in classes] == ["EveryNth"] and [ast.unparse(b) for b in classes[0].bases] == ["Policy"]
    methods = {n.name for n in classes[0].body if isinstance(n, ast.FunctionDef)} - {"__post_init__"}
    assert methods and methods <= set(FORWARDED) and all(hasattr(Policy, m) for m in methods)
    kvpot_imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module.startswith("kvpot")}
    assert kvpot_imports == {"kvpot.policies.base", "kvpot.errors"}


def test_every_list_and_check_of_policies_takes_the_registered_toy(registry):
    """What a user meets before the model loads, with nothing edited for the toy: the help's list of
    policies, the settings (spec parsed, budget fitted) and the budget check's refusal."""
    assert "every_nth" in policy_names().split(", ")
    settings, policy = RunSettings(policy="every_nth:stride=3", budget=256, chunk=64).check_with_policy()
    assert policy == EveryNth(stride=3) and policy._fitted_for == (256, 64)
    with pytest.raises(KvpotError, match="every_nth: stride must be positive"):
        RunSettings(policy="every_nth:stride=0", budget=256, chunk=64).check_with_policy()
    with pytest.raises(BudgetTooSmall, match="raise --budget to at least 1"):
        check_budget("every_nth", 0, 64)


def test_kvpot_ask_reads_with_the_registered_toy(smollm2_path, registry, monkeypatch, tmp_path):
    engines = []

    class RecordedEngine(session_module.Engine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            engines.append(self)

    monkeypatch.setattr(session_module, "Engine", RecordedEngine)
    text, question, _ = logbook(n_entries=12, seed=3)
    doc = tmp_path / "logbook.txt"
    doc.write_text(text)
    res = CliRunner().invoke(app, ["ask", str(doc), question, "-m", str(smollm2_path), "--policy",
                                   f"every_nth:stride={STRIDE}", "--budget", str(BUDGET), "--chunk", str(CHUNK),
                                   "--no-focus", "-n", "4", "--threads", "2", "--prompt-format", "completion"])
    assert res.exit_code in (0, 5), res.output  # 5: the model answered nothing, not this test's concern
    [eng] = engines
    assert eng.policy == EveryNth(stride=STRIDE)
    assert eng.tokens_seen > 4 * BUDGET and eng.n_compactions >= 4


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_the_toy_reads_a_document_longer_than_its_budget_and_answers(model, request, registry):
    text = logbook(n_entries=12, seed=3)[0]
    eng = Engine(str(request.getfixturevalue(model)), make_policy(f"every_nth:stride={STRIDE}"),
                 EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2))
    held: list[int] = []   # the stream positions the pot holds, by the rule restated above
    seen = 0               # tokens read (the BOS included)
    compactions = 0

    def on_chunk(ev):
        nonlocal held, seen, compactions
        held, seen = held + list(range(seen, ev.tokens_read)), ev.tokens_read
        assert ev.cells_peak == len(held)
        if ev.compacted:
            compactions += 1
            held = toy_rule(held, BUDGET, STRIDE)
            assert ev.cells == BUDGET
        assert ev.cells == len(held)
        np.testing.assert_array_equal(eng.positions, np.broadcast_to(held, eng.positions.shape))

    eng.feed_text(text, on_chunk=on_chunk)
    assert seen == eng.tokens_seen > 4 * BUDGET
    assert compactions == eng.n_compactions >= 4
    assert min(held) < seen - BUDGET  # older tokens than the newest BUDGET: the rule, not recency, chose

    answer = "".join(eng.answer(" The schooner is called the", max_tokens=6))
    assert answer.strip()
    # the question and the answer's tokens (all but the last, which never enters the cache) follow the pot
    np.testing.assert_array_equal(eng.positions[0, 0], held + list(range(seen, eng.tokens_seen)))
    eng.close()
