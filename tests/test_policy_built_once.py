"""`kvpot ask` builds its policy from the spec once and fits it once: the checks before the model
loads, the reading plan, the session and the engine all use that one object, and the engine's own
`fit` finds it fitted (Policy.fit remembers the budget and chunk it was fitted for)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.policies import POLICIES, BudgetTooSmall, FullAttention, SnapKV, build_policy, make_policy
from kvpot.session import session as session_module

runner = CliRunner()
CHUNK = 64


class Counts:
    def __init__(self) -> None:
        self.built: list = []       # every policy object made from a spec
        self.fitted: list = []      # (policy, budget, chunk) of every fit that did the work
        self.fit_calls = 0          # every call to fit, those that found the policy fitted included
        self.engines: list = []     # the engines the sessions made


def counting(cls: type, counts: Counts) -> type:
    """A policy class that behaves as `cls` and registers under its name, counting builds and fits."""

    class Counted(cls):
        def __init__(self, *args, **kwargs) -> None:
            counts.built.append(self)
            super().__init__(*args, **kwargs)

        def fit(self, budget: int, chunk: int) -> None:  # Policy wraps it: runs only when not yet fitted
            counts.fitted.append((self, budget, chunk))
            super().fit(budget, chunk)

    remembered = Counted.fit

    def fit(self, budget: int, chunk: int) -> None:
        counts.fit_calls += 1
        remembered(self, budget, chunk)

    Counted.fit = fit
    return Counted


@pytest.fixture
def counts(monkeypatch) -> Counts:
    c = Counts()
    for cls in (SnapKV, FullAttention):
        monkeypatch.setitem(POLICIES, cls.name, counting(cls, c))

    class RecordedEngine(session_module.Engine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            c.engines.append(self)

    monkeypatch.setattr(session_module, "Engine", RecordedEngine)
    return c


@pytest.fixture(scope="module")
def doc(tmp_path_factory, gemma_path):
    text, question, _ = logbook()
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question


CASES = {
    # --no-focus: a focused read is a second session, with a policy of its own (tests/test_focus.py)
    "snapkv, a budget smaller than the input": ["--policy", "snapkv", "--budget", "256", "--no-focus"],
    "full attention, the budget planned from the input": ["--policy", "full"],
    "full attention, a budget given": ["--policy", "full", "--budget", "4096"],
}


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_ask_builds_and_fits_the_policy_once(options, counts, doc):
    path, question = doc
    res = runner.invoke(app, ["ask", str(path), question, *options, "--chunk", str(CHUNK), "-n", "4",
                              "--threads", "2", "--prompt-format", "completion"])
    assert res.exit_code in (0, 5), res.output  # 5: the model answered nothing, not this test's concern
    assert len(counts.engines) == 1
    engine = counts.engines[0]
    assert counts.built == [engine.policy]
    assert counts.fitted == [(engine.policy, engine.config.budget, CHUNK)]
    assert counts.fit_calls >= 2  # the checks' before the model loaded, and the engine's, which did nothing
    if options[1] == "snapkv":
        # the budget was smaller than the input: the pot evicted
        assert engine.tokens_seen > engine.config.budget and engine.n_compactions > 0


def test_a_policy_fitted_again_with_the_same_sizes_is_not_fitted_again():
    counts = Counts()
    cls = counting(SnapKV, counts)
    policy = cls()
    policy.fit(256, 64)
    policy.fit(256, 64)
    assert counts.fitted == [(policy, 256, 64)] and counts.fit_calls == 2
    policy.fit(512, 64)  # other sizes: fitted for them
    assert counts.fitted[-1] == (policy, 512, 64)


def test_a_fit_that_refuses_leaves_the_policy_unfitted():
    counts = Counts()
    policy = counting(SnapKV, counts)(window=32)
    for _ in range(2):  # refused each time: the refusal is not remembered as a fit
        with pytest.raises(BudgetTooSmall):
            policy.fit(32, 64)
    assert len(counts.fitted) == 2


def test_build_policy_is_fitted_for_its_sizes():
    policy = build_policy("infinipot", 1000, 128)
    reference = make_policy("infinipot")
    reference.fit(1000, 128)
    assert policy == reference
    policy.fit(1000, 128)  # nothing changes
    assert policy == reference
