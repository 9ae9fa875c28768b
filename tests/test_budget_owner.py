"""--budget has one owner: `Policy.fit`. The engine hands every policy the user's budget and chunk
once; the policy maps them onto its own sizes (InfiniPot's |M| and |C|, IMDC's m_max and c, ...)
or refuses with one line, and the pot never holds more than the budget plus what the policy
documents (the chunk being read; Locret's n_loc)."""

from __future__ import annotations

import pytest
from test_locret import smol_heads  # noqa: F401  (a fixture: random retaining heads for SmolLM2)

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.policies import POLICIES, BudgetTooSmall, build_policy, make_policy

BUDGET, CHUNK = 160, 64

# each policy's documented bound on the cells the pot holds, past the budget
EXTRA = {
    "infinipot": lambda p: -CHUNK,          # |M| = --budget: the pot distills before it would overflow
    "locret": lambda p: p.n_loc,            # room kept for the last n_loc prompt tokens
    "imdc": lambda p: p.chunk - CHUNK,      # its own average chunk c (at least m_max / 2, eq. 6)
    "infllm": lambda p: p._p("exc_block_size") - CHUNK,  # reads in execution blocks, not --chunk
}

SPECS = ["truncate", "streaming", "snapkv", "h2o", "infinipot", "imdc:pruner=streaming",
         "imdc:pruner=streaming,function=square-sqrt", "locret", "edgeinfinite:gate=init", "infllm"]


def test_every_policy_is_in_the_list():
    assert {s.partition(":")[0] for s in SPECS} == set(POLICIES) - {"full"}


@pytest.fixture(scope="module")
def tokens(smollm2_path):
    from kvpot.runtime.llama import LlamaModel

    document, _, _ = logbook(n_entries=40, seed=2)
    vocab = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        return vocab.tokenize(document)
    finally:
        vocab.close()


@pytest.mark.parametrize("spec", SPECS)
def test_the_pot_never_holds_more_than_the_budget(spec, request, tokens, tmp_path):
    # SmolLM2 cut to 4 blocks (the same vocabulary, so the same tokens); Locret's random heads are the whole model's
    model = request.getfixturevalue("smollm2_path" if spec == "locret" else "smollm2_cut_path")
    if spec == "locret":
        spec = f"locret:heads={request.getfixturevalue('smol_heads')}"
    elif spec == "infllm":
        spec = f"infllm:block_size=16,store={tmp_path / 'blocks.kvb'}"  # blocks of 64 need more than 160 cells
    policy = make_policy(spec)
    peaks: list[int] = []
    with Engine(str(model), policy, EngineConfig(budget=BUDGET, chunk=CHUNK, n_threads=2)) as eng:
        eng.feed(tokens, on_chunk=lambda ev: peaks.append(ev.cells_peak))
        assert eng.n_compactions > 0, "the document must be long enough to make the policy evict"
        assert eng.n_cells <= BUDGET
    name = spec.partition(":")[0]
    bound = BUDGET + CHUNK + EXTRA.get(name, lambda p: 0)(policy)
    assert max(peaks) <= policy.cache_cells(BUDGET, CHUNK) <= bound


def test_infinipot_takes_its_sizes_from_the_budget():
    p = build_policy("infinipot", 2048, 512)
    assert (p.pot, p.keep) == (2048, 1024)
    p = build_policy("infinipot:nuc_ratio=0", 1001, 512)
    assert (p.pot, p.keep) == (1001, 500)
    p = build_policy("infinipot:pot=64,keep=8", 1000, 512)  # smaller than the budget: the user's choice
    assert (p.pot, p.keep) == (64, 8)
    p = build_policy("infinipot:keep=100", 1000, 512)
    assert (p.pot, p.keep) == (1000, 100)


def test_imdc_takes_m_max_and_c_from_budget_and_chunk():
    p = build_policy("imdc:pruner=streaming", 900, 500)
    assert (p.m_max, p.chunk) == (900, 500)
    p = build_policy("imdc:pruner=streaming", 900, 300)  # c at least m_max / 2, so eq. 6 stays positive
    assert (p.m_max, p.chunk) == (900, 450)
    p = build_policy("imdc:pruner=streaming,m_max=500,chunk=100", 900, 300)
    assert (p.m_max, p.chunk) == (500, 100)


@pytest.mark.parametrize("spec, budget, needle", [
    ("infinipot:pot=4096", 1024, "infinipot: pot (|M| = 4096) is more than --budget 1024"),
    ("infinipot:n_sink=64", 100, "n_sink must be within [0, keep = 50)"),
    ("imdc:pruner=streaming,m_max=2048", 1024, "imdc: m_max (2048) is more than --budget 1024"),
    ("streaming:n_sink=64", 64, "streaming: the budget (64) must exceed n_sink (64)"),
    ("snapkv:window=32", 32, "snapkv: the budget (32) must exceed window (32)"),
    ("locret:heads=x.gguf,n_s=64", 64, "locret: the budget (64) must exceed the stabilizer length n_s (64)"),
])
def test_a_budget_the_policy_cannot_honour_is_refused(spec, budget, needle):
    with pytest.raises(Exception) as e:
        build_policy(spec, budget, 512)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_imdc_refuses_a_schedule_too_small_for_its_pruner_before_reading():
    p = build_policy("imdc:pruner=snapkv,m_0=8", 1024, 512)  # SnapKV's window is 32 cells
    with pytest.raises(BudgetTooSmall, match="keeps as few as 8 cells, too few for its pruner"):
        p.set_expected_length(128 * 512)
    p = build_policy("imdc:pruner=snapkv", 1024, 512)  # the default m_0: the paper's 1024 / 128 = 8 rises to 33
    p.set_expected_length(128 * 512)
    assert min(m for _, m in p.schedule()) == 33
