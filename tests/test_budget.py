"""`--budget auto` arithmetic (kvpot.session.auto_budget) on made-up device and model facts: no model, no machine state."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import ModelFacts, swa_layers
from kvpot.session.auto_budget import DeviceMemory, choose_reading, full_context, kv_bytes, plan_cells
from kvpot.session.beyond_window import Asking

MiB, GiB = 2**20, 2**30


def gemma_like(**kw) -> ModelFacts:
    """Gemma-3-270M's shape: 18 layers, 4 heads / 1 KV head of 256, a 512-token window on 5 of 6 layers."""
    base = dict(path=Path("m.gguf"), arch="gemma3", name="g", n_layer=18, n_head=4, n_head_kv=1, n_embd=640,
                n_ctx_train=32768, chat_template=None, head_dim_k=256, head_dim_v=256, n_ff=2048, n_vocab=262144,
                sliding_window=512, swa_layers=swa_layers("gemma3", 18, 512, None), file_bytes=253 * MiB)
    base.update(kw)
    return ModelFacts(**base)


def smol_like(**kw) -> ModelFacts:
    base = dict(path=Path("m.gguf"), arch="llama", name="s", n_layer=30, n_head=9, n_head_kv=3, n_embd=576,
                n_ctx_train=8192, chat_template=None, head_dim_k=64, head_dim_v=64, n_ff=1536, n_vocab=49152,
                sliding_window=0, swa_layers=(), file_bytes=98 * MiB)
    base.update(kw)
    return ModelFacts(**base)


def test_gemma3_pattern_matches_llama_cpp():
    # set_swa_pattern(6): layers 5, 11, 17 are global, the other 15 slide
    pattern = swa_layers("gemma3", 18, 512, None)
    assert [il for il, swa in enumerate(pattern) if not swa] == [5, 11, 17]
    assert swa_layers("gemma3", 18, 512, 2) == tuple(il % 2 == 0 for il in range(18))
    assert swa_layers("mystery", 4, 512, None) == (False,) * 4  # unknown: every layer global (overstates)
    assert swa_layers("gemma3", 18, 0, None) == (False,) * 18   # no window at all


def test_kv_bytes_per_layer_type():
    g = gemma_like()
    per_layer_cell = 1 * (256 + 256) * 2
    # 3 global layers grow with the context; 15 window layers stop at window + chunk
    assert kv_bytes(g, 32768, 512) == 3 * 32768 * per_layer_cell + 15 * (512 + 512) * per_layer_cell
    assert kv_bytes(g, 300, 512) == 18 * 300 * per_layer_cell
    s = smol_like()
    assert kv_bytes(s, 8192, 512) == 30 * 8192 * 3 * 128 * 2  # 180 MiB, every layer global


def held_logit_rows(rows: int) -> int:
    """Logit rows alive at once, written out: the marked row's logits in the graph and llama.cpp's copy;
    when every row is scored (NuC), also one block of rows through the output head: 64 rows, or
    ceil(rows / 16) past 16 blocks, never more than the step."""
    return 2 if rows == 1 else min(rows, max(64, math.ceil(rows / 16))) + 2


def expected_cells(facts: ModelFacts, free: int, chunk: int, rows: int) -> int:
    """The same budget written out by hand, term by term (module docstring of kvpot.session.auto_budget)."""
    row_kv = facts.n_head_kv * (facts.head_dim_k + facts.head_dim_v) * 2
    n_swa = sum(facts.swa_layers)
    n_global = facts.n_layer - n_swa
    fixed = (n_swa * (facts.sliding_window + chunk) * row_kv      # window caches
             + held_logit_rows(rows) * facts.n_vocab * 4           # logits
             + chunk * (4 * facts.n_embd + 2 * facts.n_ff) * 4)   # activations
    per_cell = n_global * row_kv + 2 * facts.n_head * chunk * 4   # KV + scores and softmax
    margin = max(512 * MiB, free // 4)
    return (free - margin - facts.file_bytes - fixed) // per_cell


@pytest.mark.parametrize("free", [GiB, 2 * GiB, 3 * GiB])
@pytest.mark.parametrize("make", [gemma_like, smol_like])
def test_plan_follows_free_memory_and_stops_at_the_trained_context(make, free):
    facts = make()
    if free == GiB:  # below the trained context on both: the terms decide
        assert expected_cells(facts, free, 512, 512) < facts.n_ctx_train
    for rows in (1, 512):
        want = expected_cells(facts, free, 512, rows)
        plan = plan_cells(facts, DeviceMemory(free, "RAM"), chunk=512, logit_rows=rows)
        assert plan.cells == min(want, facts.n_ctx_train)
        assert "free in RAM" in plan.reason
        assert ("capped at the model's trained context" in plan.reason) == (want > facts.n_ctx_train)
    # NuC's every-row logits cost Gemma's 262K vocabulary 1 GiB: fewer cells than with one row
    few = plan_cells(facts, DeviceMemory(free, "RAM"), 512, 512).cells
    many = plan_cells(facts, DeviceMemory(free, "RAM"), 512, 1).cells
    assert few <= many


def test_plan_on_a_laptop_reaches_the_trained_context():
    for facts in (gemma_like(), smol_like()):
        plan = plan_cells(facts, DeviceMemory(24 * GiB, "RAM"), 512, 512)
        assert plan.cells == facts.n_ctx_train


def test_weights_count_only_where_they_live():
    facts = gemma_like(n_ctx_train=10**7)
    on_cpu = plan_cells(facts, DeviceMemory(3 * GiB, "RAM", holds_weights=True), 512, 1).cells
    on_gpu = plan_cells(facts, DeviceMemory(3 * GiB, "GPU", holds_weights=False), 512, 1).cells
    per_cell = 3 * 512 * 2 + 2 * 4 * 512 * 4
    assert on_gpu - on_cpu == pytest.approx(facts.file_bytes / per_cell, abs=1)


def test_a_kept_copy_of_the_read_state_costs_its_kv_once_more():
    """chat keeps the state after reading for /reset: every cell's KV (the global layers') and the
    sliding-window caches twice; `kvpot ask` keeps none."""
    facts = gemma_like(n_ctx_train=10**7)
    mem = DeviceMemory(3 * GiB, "RAM")
    once = plan_cells(facts, mem, 512, 1).cells
    kept = plan_cells(facts, mem, 512, 1, keeps_copy=True).cells
    kv_cell, scores_cell = 3 * 512 * 2, 2 * 4 * 512 * 4     # 3 global layers x 1 KV head x (256 + 256) x f16
    window = 15 * (512 + 512) * 512 * 2                     # 15 window layers x (window + chunk) cells
    # the same bytes, spent at the kept copy's price: its window caches, then per cell KV twice
    assert kept == pytest.approx((once * (kv_cell + scores_cell) - window) / (2 * kv_cell + scores_cell), abs=1)
    assert kept < once


def test_too_little_memory_is_refused_with_the_numbers():
    with pytest.raises(KvpotError, match=r"not enough memory for a pot: 700 MiB free in RAM"):
        plan_cells(gemma_like(), DeviceMemory(700 * MiB, "RAM"), 512, 512)


def test_full_attention_when_the_input_fits_else_the_largest_pot():
    plan = plan_cells(gemma_like(), DeviceMemory(24 * GiB, "RAM"), 512, 512)
    reserve, chunk = 448, 512
    fits = 32768 - reserve  # full attention needs no reading room past the document
    r = choose_reading(plan, 32768, fits, reserve, chunk)
    assert (r.mode, r.cells) == ("full", fits) and "full attention" in r.reason
    r = choose_reading(plan, 32768, fits + 1, reserve, chunk)
    assert (r.mode, r.cells) == ("pot", 32768 - reserve - chunk)
    r = choose_reading(plan, 32768, None, reserve, chunk)  # stdin: length unknown
    assert r.mode == "pot" and "unknown" in r.reason
    # a small device: the limit is its memory, not the model
    small = plan_cells(gemma_like(), DeviceMemory(GiB, "RAM"), 512, 512)
    assert small.cells < 32768
    assert choose_reading(small, 32768, small.cells - reserve, reserve, chunk).mode == "full"
    assert choose_reading(small, 32768, small.cells - reserve + 1, reserve, chunk).mode == "pot"


def test_policy_full_sizes_from_the_input_and_refuses_before_reading():
    assert full_context(8192, 7000, 448, 512, limit=10**6) == 7000
    assert full_context(8192, 8192 - 448, 448, 512, limit=10**6) == 8192 - 448  # as stock: no reading room
    with pytest.raises(KvpotError, match=r"the input is 7,800 tokens, 8,248 cells .* trained context 8,192"):
        full_context(8192, 7800, 448, 512, limit=10**6)
    with pytest.raises(KvpotError, match=r"more than the memory for 4,000 cells"):
        full_context(8192, 3600, 448, 512, limit=4000)
    assert full_context(8192, None, 448, 512, limit=10**6) == 8192 - 448  # stdin: the most it can take


def _dev(name: str, kind: str, backend: str, free: int):
    from kvpot.runtime.devices import Device

    return Device(name=name, description=f"{name} test device", kind=kind, backend=backend,
                  free_bytes=free, total_bytes=2 * free, handle=0)


CPU = _dev("CPU", "CPU", "CPU", 1 << 40)


@pytest.mark.parametrize("devs, want", [
    ([CPU], []),                                                               # CPU only: RAM
    ([CPU, _dev("CUDA0", "GPU", "CUDA", 8 << 30)], ["CUDA0"]),
    ([CPU, _dev("CUDA0", "GPU", "CUDA", 8 << 30), _dev("CUDA1", "GPU", "CUDA", 4 << 30)], ["CUDA0", "CUDA1"]),
    ([CPU, _dev("Vulkan0", "IGPU", "Vulkan", 2 << 30)], ["Vulkan0"]),             # an iGPU when no discrete GPU
    ([CPU, _dev("Vulkan0", "IGPU", "Vulkan", 2 << 30), _dev("CUDA0", "GPU", "CUDA", 8 << 30)], ["CUDA0"]),
    ([CPU, _dev("CUDA0", "GPU", "CUDA", 8 << 30), _dev("RPC0[h:1]", "GPU", "RPC", 3 << 30)],
     ["RPC0[h:1]", "CUDA0"]),                                                  # RPC servers first, as llama.cpp
    ([CPU, _dev("BLAS", "ACCEL", "BLAS", 0)], []),                            # an accelerator works beside the CPU
])
def test_layers_go_where_llama_cpp_puts_them(devs, want):
    from kvpot.runtime.devices import layer_devices

    assert [d.name for d in layer_devices(devs)] == want


def test_budget_auto_plans_with_the_memory_of_the_devices_holding_the_layers(monkeypatch):
    from kvpot.session.auto_budget import MEMORY_ENV, device_memory

    monkeypatch.delenv(MEMORY_ENV, raising=False)
    gpus = [CPU, _dev("CUDA0", "GPU", "CUDA", 8 << 30), _dev("CUDA1", "GPU", "CUDA", 4 << 30)]
    mem = device_memory(gpus)
    assert mem.free_bytes == 12 << 30 and "CUDA0" in mem.where and "CUDA1" in mem.where and mem.holds_weights
    ram = device_memory([CPU])
    assert ram.where == "RAM" and ram.free_bytes != CPU.free_bytes  # the OS's figure, not the CPU device's
    monkeypatch.setenv(MEMORY_ENV, str(3 << 30))  # the user's figure wins over any probe
    assert device_memory(gpus).free_bytes == 3 << 30


def test_flash_attention_plans_no_scores_over_the_cells():
    """With flash attention (ask's default) a step's attention over the cells is only the f16 mask's
    column (chunk x 2 bytes a cell), not the scores and their softmax in every head (2 x heads x chunk
    x 4 bytes): written out for SmolLM2's shape, the plan without a trained-context cap holds that much
    more."""
    facts = smol_like(n_ctx_train=10**7)
    mem = DeviceMemory(GiB, "RAM")
    without = plan_cells(facts, mem, 512, 1).cells
    with_fa = plan_cells(facts, mem, 512, 1, flash_attn=True).cells
    kv_cell = 30 * 3 * (64 + 64) * 2
    usable_without = without * (kv_cell + 2 * 9 * 512 * 4)  # what the plan spent on cells, within one cell
    assert with_fa == pytest.approx(usable_without / (kv_cell + 512 * 2), abs=usable_without / without / kv_cell + 1)
    assert with_fa > 2 * without  # SmolLM2: 22.5 KiB of KV a cell against 36 KiB of scores
    assert "at 23.5 KiB per cell" in plan_cells(facts, mem, 512, 1, flash_attn=True).reason


def test_auto_flash_attention_only_where_the_window_does_not_fit_without_it():
    """`flash_attn = auto`: off where the device holds the model's whole trained context without it (it
    reads large contexts slower on a CPU), on where it does not (it holds two to five times the cells),
    on where not even a minimal pot fits without it; "on" and "off" are kept as asked."""
    from kvpot.session.reading_plan import resolve_flash_attn
    from kvpot.session.settings import RunSettings

    facts = smol_like()
    settings = RunSettings(chunk=512)
    assert settings.flash_attn == "auto"
    roomy, small, tiny = (DeviceMemory(n, "RAM") for n in (24 * GiB, GiB, 700 * MiB))
    assert plan_cells(facts, roomy, 512, 512).cells == facts.n_ctx_train
    assert plan_cells(facts, small, 512, 512).cells < facts.n_ctx_train
    off, why_off = resolve_flash_attn(settings, facts, roomy, True, False)
    assert off.flash_attn == "off" and why_off is None
    on, why_on = resolve_flash_attn(settings, facts, small, True, False)
    held = plan_cells(facts, small, 512, 512).cells
    assert on.flash_attn == "on"
    assert why_on == (f"flash attention on (auto: without it this device holds {held:,} cells, "
                      f"under the model's {facts.n_ctx_train:,}-token window)")
    assert resolve_flash_attn(settings, facts, tiny, True, False)[0].flash_attn == "on"
    for asked in ("on", "off"):
        s = RunSettings(chunk=512, flash_attn=asked)
        assert resolve_flash_attn(s, facts, roomy, True, False) == (s, None)
        assert resolve_flash_attn(s, facts, small, True, False) == (s, None)


def test_auto_flash_attention_with_a_budget_asks_for_the_pot_only(tmp_path):
    """With --budget N the reading's size is known: auto turns flash attention on only where the device cannot
    hold, without it, the pot's context (its policy's cells while reading plus the answer's room), whatever the
    model's window; the plan's context is the policy's own count (computed by the policy, not restated here)."""
    from kvpot.ingest import collect_sources
    from kvpot.policies import make_policy
    from kvpot.session.reading_plan import plan_reading, resolve_flash_attn
    from kvpot.session.settings import RunSettings

    facts = smol_like(n_ctx_train=32768)
    small = DeviceMemory(GiB, "RAM")
    held = plan_cells(facts, small, 512, 512).cells
    assert held < facts.n_ctx_train
    settings = RunSettings(chunk=512)
    assert resolve_flash_attn(settings, facts, small, True, False, context=held)[0].flash_attn == "off"
    on, why = resolve_flash_attn(settings, facts, small, True, False, context=held + 1)
    assert on.flash_attn == "on" and why.endswith(f"holds {held:,} cells, under the {held + 1:,} this reading needs)")
    # a context past the window is the window's question
    assert resolve_flash_attn(settings, facts, small, True, False, context=10**6)[1].endswith("32,768-token window)")

    doc = tmp_path / "doc.txt"
    doc.write_text("words " * 100)
    reserve = 300

    def plan(budget: int):
        return plan_reading(RunSettings(chunk=512, policy="infinipot", budget=budget), facts,
                            collect_sources([str(doc)]), policy_chosen=True, reserve=reserve, memory=small)

    # InfiniPot's pot holds its budget while reading (the chunk inside it); llama.cpp rounds a context up to a
    # multiple of 256 cells
    room = held // 256 * 256
    fits = room - reserve
    p = make_policy("infinipot")
    p.fit(fits, 512)
    assert p.cache_cells(fits, 512) + reserve == room
    assert plan(fits).settings.flash_attn == "off" and plan(fits).note is None
    over = plan(fits + 1)
    assert over.settings.flash_attn == "on" and f"under the {room + 256:,} this reading needs" in over.note


def test_auto_flash_attention_asks_again_for_the_reading_the_budget_chose(smollm2_path, tmp_path):
    """With the budget auto, flash attention is weighed against the model's window before the reading is
    chosen; where the reading chosen needs less (an input that fits in full, the pot measured best past
    the window), auto asks again for that reading's own context: off where the device holds it without
    flash attention, on (saying how many cells it needs) where it does not."""
    from kvpot.ingest import collect_sources
    from kvpot.models.gguf_file import read_model_facts
    from kvpot.session.reading_plan import plan_reading
    from kvpot.session.settings import RunSettings

    facts = read_model_facts(smollm2_path)
    mem = DeviceMemory(800 * MiB, "RAM")
    held = plan_cells(facts, mem, 512, 1).cells  # without flash attention: under the 8,192-token window
    assert 512 < held < facts.n_ctx_train <= plan_cells(facts, mem, 512, 1, flash_attn=True).cells + 512
    reserve = 256

    def plan(words: int):
        doc = tmp_path / f"doc{words}.txt"
        doc.write_text("words " * words)
        return plan_reading(RunSettings(chunk=512), facts, collect_sources([str(doc)]), policy_chosen=False,
                            reserve=reserve, memory=mem, asking=Asking.FIRST)

    short = plan(200)  # full attention over ~200 tokens: far under what the device holds without it
    assert short.settings.policy == "full" and short.settings.flash_attn == "off", short.note
    assert "flash attention" not in short.note
    long = plan(held + 1000)  # full attention over more than it holds without: on, for this reading's cells
    assert long.settings.policy == "full" and long.settings.flash_attn == "on", long.note
    import re

    said = re.search(r"holds ([\d,]+) cells, under the ([\d,]+) this reading needs", long.note)
    assert said, long.note
    held_said, needs = (int(g.replace(",", "")) for g in said.groups())
    assert held_said <= held < needs < facts.n_ctx_train  # (the plan counts the logit rows InfiniPot's steps need)
