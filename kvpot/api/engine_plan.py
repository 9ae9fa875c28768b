"""The bare engine's plan, for the benchmarks that measure the engine itself against stock llama.cpp (bench
throughput, niah's and ppl's grids, InfLLM's cache rules): exactly the budget, chunk, thread count and flash
attention asked, with no chat framing, no automatic budget, no registry defaults and no session around it.

`plan_engines` checks everything that can refuse before a model loads, in one place and in one order (every
spec fitted to the budget, then the model, then every spec's adapters against it, then the context's size) and
returns a frozen `EnginePlan` per spec: the policy built and fitted once, the settings the engine runs with.
`EnginePlan.open` makes the engine (the first thing that loads the model); `again` is the same plan for another
engine (its own copy of the policy, another budget where one is given)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from kvpot.engine import DEFAULT_ANSWER_RESERVE, Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.models.gguf_file import ModelFacts
from kvpot.models.resolve import resolve_model
from kvpot.policies import ExternalMemory, Policy
from kvpot.session.checks import check_adapters, check_budget

# the largest engine context a benchmark plans (budget + chunk): a million cells, past what any device it runs on
# holds (a mistyped budget is refused before stock llama.cpp is measured, not after)
MAX_BENCH_CELLS = 1 << 20

__all__ = ["DEFAULT_ANSWER_RESERVE", "EnginePlan", "beside_the_pot", "plan_engine", "plan_engines"]


@dataclass(frozen=True)
class EnginePlan:
    """One engine's every setting, decided and checked before the model loads: the model (`model_path`: the file
    the engine loads and finds shipped adapters beside), the policy built from `spec` and fitted to `budget` and
    `chunk` (its adapters checked against the model), and the engine's numbers. Opened once: the policy belongs
    to the one engine that runs it (`again` copies the plan for another)."""

    model_path: str
    facts: ModelFacts
    model_name: str             # the registry's name, or the file's
    spec: str
    policy: Policy
    budget: int                 # cells the pot keeps after each compaction, exactly as asked
    chunk: int                  # tokens per decode step (llama.cpp's n_batch and n_ubatch)
    threads: int
    flash_attn: bool = False
    answer_reserve: int = DEFAULT_ANSWER_RESERVE  # cells past budget + chunk for a question and its answer
    measure_nll: bool = False   # score every token read (perplexity)

    def again(self, budget: int | None = None) -> EnginePlan:
        """The same engine again, with its own copy of the fitted policy; with `budget`, the policy built from
        the spec once more and fitted to that budget (full attention's context sized to one input)."""
        if budget is None or budget == self.budget:
            return dataclasses.replace(self, policy=copy.deepcopy(self.policy))
        _check_cells(budget, self.chunk)
        policy = check_budget(self.spec, budget, self.chunk)
        return dataclasses.replace(self, policy=policy, budget=budget)

    def open(self) -> Engine:
        """Load the model and make the engine (closing it deletes what its policy kept on disk)."""
        return Engine(self.model_path, self.policy,
                      EngineConfig(budget=self.budget, chunk=self.chunk, n_threads=self.threads,
                                   flash_attn=self.flash_attn, answer_reserve=self.answer_reserve,
                                   measure_nll=self.measure_nll))


def _check_cells(budget: int, chunk: int) -> None:
    if budget + chunk > MAX_BENCH_CELLS:
        raise KvpotError(f"budget {budget} + chunk {chunk} is larger than any context kvpot can allocate")


def plan_engines(model: str, specs: Iterable[str], budget: int, chunk: int, threads: int, *, flash_attn: bool = False,
                 answer_reserve: int | None = None, measure_nll: bool = False,
                 expected_tokens: int | None = None) -> list[EnginePlan]:
    """A bare engine's plan per policy spec for `model` (a registry name or a GGUF path), every refusal before
    the model loads and in this order: a bad spec or a budget it cannot keep (`expected_tokens`: the longest
    input, for a policy whose smallest step shrinks as the input grows), then the model, then each spec's
    adapters against it, then a context larger than kvpot can allocate."""
    specs = list(specs)
    policies = [check_budget(spec, budget, chunk, expected_tokens=expected_tokens) for spec in specs]
    facts, known = resolve_model(model)
    for policy in policies:
        check_adapters(policy, facts.path)
    _check_cells(budget, chunk)
    reserve = DEFAULT_ANSWER_RESERVE if answer_reserve is None else answer_reserve
    name = known.name if known else facts.name
    return [EnginePlan(str(facts.path), facts, name, spec, policy, budget, chunk, threads, flash_attn, reserve,
                       measure_nll)
            for spec, policy in zip(specs, policies)]


def plan_engine(model: str, spec: str, budget: int, chunk: int, threads: int, **options) -> EnginePlan:
    """plan_engines for one spec."""
    return plan_engines(model, [spec], budget, chunk, threads, **options)[0]


def beside_the_pot(engine: Engine) -> tuple[int, dict | None]:
    """What the engine's policy keeps beside the pot now: bytes on disk (InfLLM's block store), and what the
    memory's own caches did (InfLLM's per-layer block caches), or None."""
    memory = ExternalMemory.of(engine.policy)
    return memory.disk_bytes(), memory.cache_stats()
