"""The bare engine's plan (kvpot.api.engine_plan), what the benchmarks that measure the engine stand on: every
refusal before the model loads in one order (the spec and budget, the model, the adapters, the context's size),
the settings exactly as asked, and an engine opened from the plan that reads exactly as one built by hand from
the same spec and numbers (the measurement is the engine's, the plan changes none of it)."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.api.engine_plan import DEFAULT_ANSWER_RESERVE, beside_the_pot, plan_engine, plan_engines
from kvpot.errors import KvpotError

NO_MODEL = "/nonexistent/model.gguf"


def test_a_bad_spec_or_budget_is_refused_before_the_model():
    with pytest.raises(KvpotError, match="raise --budget to at least"):
        plan_engines(NO_MODEL, ["streaming", "snapkv"], 16, 128, 2)
    with pytest.raises(KvpotError, match="unknown policy|no_such"):
        plan_engine(NO_MODEL, "no_such", 256, 128, 2)
    with pytest.raises(KvpotError, match="nonexistent"):
        plan_engine(NO_MODEL, "streaming", 256, 128, 2)


def test_the_plan_holds_what_was_asked(smollm2_cut_path):
    plans = plan_engines(str(smollm2_cut_path), ["streaming", "full"], 256, 64, 1, flash_attn=True, measure_nll=True)
    assert [p.spec for p in plans] == ["streaming", "full"]
    for p in plans:
        assert (p.model_path, p.budget, p.chunk, p.threads, p.flash_attn, p.measure_nll) == (
            str(smollm2_cut_path), 256, 64, 1, True, True)
        assert p.answer_reserve == DEFAULT_ANSWER_RESERVE
        assert p.policy._fitted_for == (256, 64)  # built and fitted once, before any model loads
    again = plans[0].again()
    assert again.policy is not plans[0].policy and again.policy == plans[0].policy
    wider = plans[1].again(budget=1024)
    assert wider.budget == 1024 and wider.policy._fitted_for == (1024, 64)
    with pytest.raises(KvpotError, match="larger than any context"):
        plan_engine(str(smollm2_cut_path), "full", 1 << 20, 64, 1)


def test_an_opened_plan_reads_as_an_engine_built_by_hand(smollm2_cut_path):
    from kvpot.bench.logbook import generated_tokens
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    def read(eng) -> tuple:
        with eng:
            tokens = eng.model.bos() + generated_tokens(eng.model, 700)
            eng.feed(tokens)
            logits = eng.prompt(eng.model.tokenize("\n\nQuestion: what is this?\nAnswer:"))
            st = eng.stats()
            return (eng.tokens_seen, eng.n_compactions, st.bytes_total, eng.ctx.n_ctx, beside_the_pot(eng)[0],
                    np.asarray(logits, dtype=np.float32).copy())

    spec = "infllm"
    planned = read(plan_engine(str(smollm2_cut_path), spec, 256, 64, 2, answer_reserve=300).open())
    by_hand = read(Engine(str(smollm2_cut_path), make_policy(spec),
                          EngineConfig(budget=256, chunk=64, n_threads=2, answer_reserve=300)))
    assert planned[:-1] == by_hand[:-1] and planned[1] > 0
    assert np.array_equal(planned[-1], by_hand[-1])
