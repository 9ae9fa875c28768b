"""IMDC: schedules recomputed here, with plain loops, from the paper's equations (eq. 1, 5-8),
then the engine-facing hooks, a simulated feed loop, delegation to the pruner and the spec parser.

Rounding the module documents, and the tolerances that follow from it:
  m_i is floor(paper's m_i): 0 <= paper - m_i < 1 (1e-9 slack for the float roots of eq. 8);
  c_i (i >= 1) is floor or ceil of eq. 6's c + m_hat - m_{i-1}, computed with the integer m_i,
  because m_hat is a fraction with denominator n - 1 while the chunks must be integers that sum
  to exactly (n - 1) c; so the attention length c_i + m_{i-1} (eq. 5) takes at most two adjacent
  values, floor(c + m_hat) and ceil(c + m_hat): a tolerance of one token.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import (
    H2O,
    IMDC,
    Catalyst,
    Policy,
    PotView,
    QuestionFirst,
    SnapKV,
    StreamingLLM,
    TapRequest,
    Truncate,
    make_policy,
)

PRIMES = [2, 3, 97, 509, 521, 1021, 1031, 4093, 8191, 10007, 32749, 32771]
LENGTHS = sorted(set(range(1, 40)) | {511, 512, 513, 1023, 1024, 1025, 2048, 5000, 32768, 32769} | set(PRIMES))
# (m_max, c, function) for which eq. 6 gives every step at least one token at these lengths
FEASIBLE = [(1024, 512, "linear"), (1024, 512, "sqrt"), (1024, 1024, "square"), (1024, 1024, "linear"),
            (512, 1024, "sqrt"), (300, 256, "sqrt"), (64, 64, "linear")]


# ---------------------------------------------------------------- the paper, with plain loops


def paper_n(n_tokens: int, c: int) -> int:
    return max(1, math.ceil(n_tokens / c))


def paper_memory(function: str, m_max: int, m_0: int, n: int) -> list[float]:
    """Eq. 1 (linear), eq. 7 (square), eq. 8 (sqrt); FM keeps m_max."""
    out = []
    for i in range(n):
        if function == "fixed" or n == 1:
            out.append(float(m_max))
        elif function == "linear":
            out.append((m_max - m_0) * i / (n - 1) + m_0)
        elif function == "square":
            out.append((m_max - m_0) * i ** 2 / (n - 1) ** 2 + m_0)
        elif function == "sqrt":
            out.append((m_max - m_0) * math.sqrt(i) / math.sqrt(n - 1) + m_0)
        else:
            raise ValueError(function)
    return out


def paper_chunks(memory: list[int], c: int) -> list[Fraction]:
    """Eq. 6 in exact rationals: c_0 = c, c_i = c + m_hat - m_{i-1}, m_hat = sum_{i<=n-2} m_i / (n-1)."""
    n = len(memory)
    chunks = [Fraction(c)]
    if n > 1:
        m_hat = Fraction(sum(memory[: n - 1]), n - 1)
        for i in range(1, n):
            chunks.append(c + m_hat - memory[i - 1])
    return chunks


def planned(n_tokens: int, **kwargs) -> IMDC:
    kwargs = {"m_max": 1024, "chunk": 512, **kwargs}  # what fit(budget=1024, chunk=512) would set
    policy = IMDC(Truncate(), **kwargs)  # a pruner that works with any memory size: these test the schedule
    policy.set_expected_length(n_tokens)
    return policy


def check_memory(sched: list[tuple[int, int]], function: str, m_max: int, m_0: int | None, n_tokens: int, c: int):
    n = paper_n(n_tokens, c)
    assert len(sched) == n
    m_0 = m_0 if m_0 is not None else max(1, m_max // n)  # section 4.1: m_0 = m_max / n
    memory = [m for _, m in sched]
    for got, want in zip(memory, paper_memory(function, m_max, m_0, n)):
        assert want - 1 < got <= want + 1e-9, (memory, function, n_tokens)
    assert memory[-1] == m_max
    assert memory == sorted(memory)
    if n > 1 and function != "fixed":
        assert memory[0] == m_0


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize(("m_max", "c", "function"), FEASIBLE)
def test_imdc_schedule_follows_eq_1_6_7_8(m_max: int, c: int, function: str):
    for n_tokens in LENGTHS:
        sched = planned(n_tokens, m_max=m_max, chunk=c, function=function).schedule()
        check_memory(sched, function, m_max, None, n_tokens, c)
        chunks = [ci for ci, _ in sched]
        memory = [m for _, m in sched]
        n = len(sched)
        # step 0 gives up the n*c - T surplus (the module's documented choice)
        assert chunks[0] == c - (n * c - n_tokens)
        ref = paper_chunks(memory, c)
        for i in range(1, n):
            assert math.floor(ref[i]) <= chunks[i] <= math.ceil(ref[i]), (i, chunks, ref)
        # eq. 5: constant attention length for i >= 1, within one token, the ceil ones last
        attention = [chunks[i] + memory[i - 1] for i in range(1, n)]
        if attention:
            m_hat = Fraction(sum(memory[: n - 1]), n - 1)
            assert set(attention) <= {math.floor(c + m_hat), math.ceil(c + m_hat)}
            assert attention == sorted(attention)
        assert sum(chunks) == n_tokens


def test_imdc_paper_setting_exactly():
    """Chunk = memory = 1024 (Table 1), 32 chunks of average 1024: m_0 = 32 and eq. 6 exactly."""
    sched = planned(32 * 1024, m_max=1024, chunk=1024).schedule()
    memory = [m for _, m in sched]
    assert memory == [32 + (1024 - 32) * i // 31 for i in range(32)] and memory[0] == 32
    m_hat = Fraction(sum(memory[:31]), 31)
    for i, (ci, _) in enumerate(sched):
        want = 1024 if i == 0 else 1024 + m_hat - memory[i - 1]
        assert abs(ci - want) < 1
    assert sum(c for c, _ in sched) == 32 * 1024


@pytest.mark.parametrize("function", ["fixed", "linear", "sqrt", "square"])
@pytest.mark.parametrize("decremental", [True, False])
@pytest.mark.parametrize(("m_max", "c"), [(1024, 512), (1024, 1024), (2048, 512), (100, 7), (5, 64)])
def test_every_length_is_read_exactly(function: str, decremental: bool, m_max: int, c: int):
    """Total tokens fed == input length for every length, or a clear refusal where eq. 6 would
    give a step no tokens (memory rising faster than the chunk can shrink)."""
    for n_tokens in LENGTHS:
        policy = IMDC(Truncate(), m_max=m_max, chunk=c, function=function, decremental_chunk=decremental)
        n = paper_n(n_tokens, c)
        m_0 = max(1, m_max // n)
        real_memory = paper_memory(function, m_max, m_0, n)
        try:
            policy.set_expected_length(n_tokens)
        except KvpotError as err:
            assert decremental and function != "fixed", err
            assert "\n" not in str(err) and "chunk" in str(err)
            # the paper's own chunks (with its real memory) would be at most about one token
            ref = paper_chunks([math.floor(m) for m in real_memory], c)
            assert min(ref) < 2, (n_tokens, ref)
            continue
        sched = policy.schedule()
        chunks = [ci for ci, _ in sched]
        assert sum(chunks) == n_tokens and min(chunks) >= 1
        check_memory(sched, function, m_max, None, n_tokens, c)


def test_fixed_memory_is_constant():
    for decremental in (True, False):
        for n_tokens in LENGTHS:
            sched = planned(n_tokens, m_max=1024, chunk=512, function="fixed", decremental_chunk=decremental).schedule()
            assert {m for _, m in sched} == {1024}
            chunks = [c for c, _ in sched]
            assert chunks[:-1] == [512] * (len(chunks) - 1)
            assert chunks[-1] == n_tokens - 512 * (len(chunks) - 1)  # the last chunk takes the remainder


@pytest.mark.parametrize("function", ["linear", "sqrt", "square"])
def test_incremental_memory_without_decremental_chunk_keeps_c(function: str):
    for n_tokens in LENGTHS:
        sched = planned(n_tokens, m_max=2048, chunk=512, function=function, decremental_chunk=False).schedule()
        chunks = [c for c, _ in sched]
        assert chunks[:-1] == [512] * (len(chunks) - 1)
        assert 1 <= chunks[-1] <= 512 and sum(chunks) == n_tokens
        check_memory(sched, function, 2048, None, n_tokens, 512)


def test_explicit_m_0_and_the_small_cases():
    sched = planned(10 * 100, m_max=400, chunk=100, m_0=40, decremental_chunk=False).schedule()
    assert [m for _, m in sched] == [40 + 360 * i // 9 for i in range(10)]
    assert planned(300, m_max=1024, chunk=512).schedule() == [(300, 1024)]  # one chunk: no growth
    sched = planned(513, m_max=1024, chunk=512).schedule()  # two chunks: m_0 = 512, c_1 = c
    assert sched == [(1, 512), (512, 1024)]
    # m_0 = m_max / n would be 0 past m_max chunks: one cell at least
    assert planned(64 * 1000, m_max=32, chunk=64, decremental_chunk=False).schedule()[0][1] == 1


def test_the_default_m_0_rises_to_what_the_pruner_keeps():
    """Section 4.1's m_0 = m_max / n falls below SnapKV's window (32 cells + 1) past 31 chunks of a
    1024-cell memory; the default m_0 is then the pruner's least budget, and eq. 1 runs from there."""
    n_tokens = 2048 * 512  # 1M tokens, 2,048 chunks: the paper's m_0 would be 0, floored to 1
    policy = IMDC(SnapKV(), m_max=1024, chunk=512, decremental_chunk=False)
    policy.set_expected_length(n_tokens)
    check_memory(policy.schedule(), "linear", 1024, 33, n_tokens, 512)
    short = IMDC(SnapKV(), m_max=1024, chunk=512)  # where the paper's is enough it stays
    short.set_expected_length(16 * 512)
    check_memory(short.schedule(), "linear", 1024, None, 16 * 512, 512)


def test_refuses_a_schedule_with_empty_chunks():
    policy = IMDC(SnapKV(), m_max=1024, chunk=512, function="square")
    with pytest.raises(KvpotError, match="decremental_chunk=false") as info:
        policy.set_expected_length(32768)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- engine hooks


@pytest.mark.parametrize(("m_max", "c", "function"), FEASIBLE + [(1024, 512, "fixed")])
def test_hooks_agree_with_schedule(m_max: int, c: int, function: str):
    for n_tokens in (1, 7, 513, 4093, 32771):
        policy = planned(n_tokens, m_max=m_max, chunk=c, function=function)
        sched = policy.schedule()
        for step, (ci, mi) in enumerate(sched):
            assert policy.chunk_size(step, 99) == ci  # the engine's chunk and budget are not IMDC's
            assert policy.budget_at(step, 99) == mi
        n = len(sched)
        assert policy.chunk_size(n, 99) == c and policy.budget_at(n + 5, 99) == m_max
        peak = max(ci + (sched[i - 1][1] if i else 0) for i, (ci, _) in enumerate(sched))
        assert policy.cache_cells(99, 99) == peak
        assert peak <= c + m_max  # the bound used before the length is known holds for any length


def test_cache_cells_before_and_after_the_length_is_known():
    policy = IMDC(StreamingLLM(), m_max=1024, chunk=512)
    assert policy.cache_cells(4096, 64) == 512 + 1024
    declared = IMDC(StreamingLLM(), m_max=1024, chunk=512, expected_tokens=32768)
    assert declared.cache_cells(4096, 64) < 512 + 1024  # IMDC's point: a lower peak than FM


def test_compaction_when_over_the_step_budget():
    policy = planned(5000)
    assert policy.wants_compaction(101, 100, 512)
    assert not policy.wants_compaction(100, 100, 512)


def simulate_feed(policy: Policy, tokens: list[int], chunk: int = 512) -> tuple[list[int], int, int]:
    """Engine.feed without a model: pieces read, cells after the last step, the peak cell count."""
    policy.set_expected_length(len(tokens))
    pieces, step, start, cells, peak = [], 0, 0, 0, 0
    while start < len(tokens):
        size = max(1, policy.chunk_size(step, chunk))
        piece = tokens[start:start + size]
        start += len(piece)
        next_size = min(policy.chunk_size(step + 1, chunk), len(tokens) - start)
        cells += len(piece)
        peak = max(peak, cells)
        budget = policy.budget_at(step, chunk)
        if policy.wants_compaction(cells, budget, next_size):
            cells = budget  # the pruner keeps `budget` cells
        pieces.append(len(piece))
        step += 1
    return pieces, cells, peak


@pytest.mark.parametrize(("m_max", "c", "function"), FEASIBLE + [(1024, 512, "fixed")])
def test_feed_loop_reads_exactly_the_input(m_max: int, c: int, function: str):
    for n_tokens in LENGTHS:
        policy = IMDC(Truncate(), m_max=m_max, chunk=c, function=function)
        pieces, cells, peak = simulate_feed(policy, list(range(n_tokens)))
        assert sum(pieces) == n_tokens
        assert pieces == [ci for ci, _ in policy.schedule()]  # every step read its whole chunk
        assert peak <= policy.cache_cells(0, 0)
        assert cells <= m_max


# ---------------------------------------------------------------- the pruner


class Recorder(Policy, QuestionFirst, Catalyst):
    """A pruner that records what it is asked (with a question and a catalyst, which IMDC does not change:
    the engine finds them through IMDC)."""

    name = "recorder"
    cr_rope = True

    def __init__(self):
        self.calls: list[str] = []

    def set_question(self, text):
        self.calls.append(f"question:{text}")

    def before_chunk(self, n_tokens):
        self.calls.append(f"before:{n_tokens}")
        return TapRequest(tap_last=3, logprobs=True)

    def after_chunk(self, view):
        self.calls.append("after_chunk")

    def catalyst_text(self):
        return "catalyst"

    def select(self, view, budget):
        self.calls.append(f"select:{budget}")
        return np.zeros((1, 1, budget), dtype=np.int64)

    def after_compaction(self, keep):
        self.calls.append("after_compaction")

    def reset(self):
        self.calls.append("reset")


def make_view(rng: np.random.Generator, n_cells: int) -> PotView:
    positions = np.stack([np.stack([rng.permutation(n_cells) for _ in range(2)]) for _ in range(3)])
    return PotView(n_layer=3, n_head_kv=2, n_cells=n_cells, positions=positions.astype(np.int64),
                   scores=rng.random((3, 2, n_cells), dtype=np.float32), logprobs=None,
                   chunk_positions=np.arange(n_cells - 16, n_cells, dtype=np.int64), tokens_seen=n_cells)


def test_delegates_to_the_pruner():
    snap = SnapKV(window=8, kernel=3)
    policy = IMDC(snap, expected_tokens=5000)
    assert policy.before_chunk(600) == snap.before_chunk(600) == TapRequest(tap_last=8)
    view = make_view(np.random.default_rng(0), 200)
    np.testing.assert_array_equal(policy.select(view, 50), snap.select(view, 50))
    assert policy.cr_rope is True  # IMDC re-encodes positions whatever its pruner (test_positions_*)

    rec = Recorder()
    policy = IMDC(rec, expected_tokens=5000)
    QuestionFirst.of(policy).set_question("why?")
    assert policy.before_chunk(12) == TapRequest(tap_last=3, logprobs=True)
    policy.after_chunk(view)
    assert Catalyst.of(policy).catalyst_text() == "catalyst"
    assert policy.select(view, 4).shape == (1, 1, 4)
    policy.after_compaction(np.zeros((1, 1, 4), dtype=np.int64))
    policy.reset()
    assert rec.calls == ["question:why?", "before:12", "after_chunk", "select:4", "after_compaction", "reset"]
    assert policy.cr_rope is True


@pytest.mark.parametrize("pruner", [SnapKV(), H2O(), StreamingLLM(), Truncate()], ids=lambda p: p.name)
def test_positions_reencoded_by_default_or_the_pruners_by_name(pruner: Policy):
    """Section 4.1: positions for memory and chunk are encoded anew at each iteration, whatever the
    pruner; positions=pruner keeps the pruner's own choice (SnapKV, H2O: text positions)."""
    assert IMDC(pruner).cr_rope is True
    assert make_policy(f"imdc:pruner={pruner.name}").cr_rope is True
    assert IMDC(pruner, positions="pruner").cr_rope is pruner.cr_rope
    assert make_policy(f"imdc:pruner={pruner.name},positions=pruner").cr_rope is pruner.cr_rope
    assert SnapKV().cr_rope is False and H2O().cr_rope is False  # so the default changes these two


def rope_positions(eng: Engine) -> np.ndarray:
    """The RoPE position each key of the compacted cells was rotated to, [pot layers, KV heads,
    n_compacted], from kvpot's C state (docs/formats.md, `POT `)."""
    words = np.frombuffer(eng.pot.state_bytes(), dtype="<i4")
    n_layer, n_head, n_compacted = (int(w) for w in words[2:5])
    return words[7:7 + n_layer * n_head * n_compacted].reshape(n_layer, n_head, n_compacted)


@pytest.mark.parametrize("positions", ["reencode", "pruner"])
def test_engine_positions_after_every_compaction(smollm2_path, positions: str):
    """IMDC(snapkv) in the engine: by default every compaction leaves the kept cells at positions
    0..m_i-1 in every layer and head, and the next chunk follows at m_i; positions=pruner leaves
    each kept key at its token's text position (SnapKV's own choice)."""
    text, _, _ = logbook(n_entries=24, seed=3)
    policy = IMDC(SnapKV(window=16), m_max=256, chunk=128, positions=positions)
    eng = Engine(str(smollm2_path), policy, EngineConfig(budget=256, chunk=128, n_threads=2))
    compacted = []

    def on_chunk(ev):
        if not ev.compacted:
            return
        n = eng.n_cells
        rope = rope_positions(eng)
        assert rope.shape == eng.positions.shape[:2] + (n,)
        if positions == "reencode":
            assert np.all(rope == np.arange(n)) and ev.stats.pos_next == n
            np.testing.assert_array_equal(eng.pot.cell_positions(n), np.arange(n))
        else:
            np.testing.assert_array_equal(rope, eng.positions)  # the tokens' stream positions
            assert ev.stats.pos_next == eng.tokens_seen
            assert np.any(rope != np.arange(n))  # heads kept different tokens, far from 0..n-1
        compacted.append(n)

    tokens = eng.model.tokenize(text)
    eng.feed_stream([tokens], expected=len(tokens), on_chunk=on_chunk)
    # step i keeps m_i (linear schedule: the memory grows)
    assert len(compacted) >= 6 and compacted == [m for _, m in policy.schedule()][:len(compacted)]
    eng.close()


def test_context_saved_with_the_old_spelling_reopens_as_saved(smollm2_path, tmp_path):
    """A context saved before `positions` existed names `imdc:pruner=snapkv,...` without it and holds SnapKV's text
    positions (what positions=pruner writes now): it reopens to the same pot and the same logits,
    because every key's RoPE position is in the file; `positions` decides later compactions only."""
    from kvpot.ingest import collect_sources
    from kvpot.models.gguf_file import read_model_facts
    from kvpot.session.context_file import read_context, write_context
    from kvpot.session.session import Session
    from kvpot.session.settings import RunSettings

    text, question, _ = logbook(n_entries=24, seed=3)
    doc = tmp_path / "logbook.txt"
    doc.write_text(text)
    facts = read_model_facts(smollm2_path)
    settings = RunSettings(policy="imdc:pruner=snapkv,m_0=64,positions=pruner", budget=256, chunk=128, threads=2,
                           prompt="completion", max_tokens=4).check()
    s = Session(facts, "smollm2-135m", settings)
    s.read(collect_sources([str(doc)]))
    pos_next = s.engine.pos_next
    assert s.engine.n_compactions > 0 and pos_next == s.engine.tokens_seen  # text positions
    ctx = tmp_path / "c.kvctx"
    s.save(ctx)
    toks = s._tokens(s.format.first_question(question))
    want = s.engine.prompt(toks)
    s.engine.close()
    saved = read_context(ctx)  # as the old kvpot wrote it
    saved.header["policy"] = saved.header["settings"]["policy"] = "imdc:pruner=snapkv,m_0=64"
    write_context(ctx, saved)
    r = Session.reopen(ctx, facts, "smollm2-135m")
    assert r.engine.policy.cr_rope is True and r.engine.pos_next == pos_next
    np.testing.assert_array_equal(r.engine.prompt(toks), want)
    r.engine.close()


def test_declared_length_wins_and_reset_forgets_it():
    policy = IMDC(Truncate(), m_max=1024, chunk=512, expected_tokens=5000)
    assert sum(c for c, _ in policy.schedule()) == 5000
    policy.set_expected_length(20000)
    assert sum(c for c, _ in policy.schedule()) == 20000
    policy.reset()
    assert sum(c for c, _ in policy.schedule()) == 5000


# ---------------------------------------------------------------- refusals and the spec parser


def test_refuses_without_a_length():
    policy = IMDC(SnapKV())
    for call in (lambda: policy.chunk_size(0, 512), lambda: policy.budget_at(0, 1024), policy.schedule):
        with pytest.raises(KvpotError, match="expected_tokens") as info:
            call()
        assert "\n" not in str(info.value)


def test_per_layer_functions_refuse_pruners_with_per_cell_state():
    with pytest.raises(KvpotError, match="per-cell state") as info:
        IMDC(H2O(), function="adaptive")
    assert "\n" not in str(info.value)
    IMDC(StreamingLLM(), function="square-sqrt")  # stateless pruners are fine


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"function": "cubic"}, "function"),
    ({"m_max": 0}, "m_max"),
    ({"chunk": 0}, "chunk"),
    ({"m_0": 2000, "m_max": 1024}, "m_0"),
    ({"m_0": 0}, "m_0"),
    ({"expected_tokens": 0}, "expected_tokens"),
    ({"positions": "text"}, "positions"),
])
def test_refuses_bad_parameters(kwargs: dict, needle: str):
    with pytest.raises(KvpotError, match=needle):
        IMDC(SnapKV(), **kwargs)
    with pytest.raises(KvpotError, match="positive"):
        IMDC(SnapKV()).set_expected_length(0)


@pytest.mark.parametrize(("spec", "expected"), [
    ("imdc:pruner=snapkv,m_max=1024,chunk=512,function=sqrt", IMDC(SnapKV(), m_max=1024, chunk=512, function="sqrt")),
    ("imdc:pruner=streaming", IMDC(StreamingLLM())),
    ("IMDC : pruner = SnapKV , decremental_chunk = false , m_0 = 64",
     IMDC(SnapKV(), decremental_chunk=False, m_0=64)),
    ("imdc:pruner=snapkv,m_0=none,expected_tokens=32768", IMDC(SnapKV(), expected_tokens=32768)),
    ("imdc:pruner=snapkv,function=fixed", IMDC(SnapKV(), function="fixed")),
    ("imdc:pruner=snapkv,positions=pruner", IMDC(SnapKV(), positions="pruner")),
])
def test_make_policy_parses_imdc(spec: str, expected: IMDC):
    got = make_policy(spec)
    assert type(got) is IMDC and got == expected
    assert (got.m_max is None or type(got.m_max) is int) and (got.m_0 is None or type(got.m_0) is int)
