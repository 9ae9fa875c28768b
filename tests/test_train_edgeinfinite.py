"""The training side of EdgeInfinite: the torch memory and gate equal the NumPy reference the in-graph
layer is tested against (tests/test_memory_gate.py); the torch backbone's keys equal llama.cpp's cached
keys; a short training run writes a gate the policy accepts. Needs the `train` extra (torch)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch  # the `train` extra: `make test` installs it (train-deps), so these tests never skip
from conftest import assert_one_line_error, run_cli  # noqa: E402

from kvpot.bench.logbook import logbook  # noqa: E402
from kvpot.converters.adapter import (  # noqa: E402
    AdapterError,
    MemoryGate,
    initial_memory_gate,
    read_memory_gate,
    write_memory_gate,
)
from kvpot.engine import Engine, EngineConfig  # noqa: E402
from kvpot.errors import KvpotError  # noqa: E402
from kvpot.policies import EdgeInfinite  # noqa: E402
from kvpot.policies.edgeinfinite_memory import fold, read  # noqa: E402
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel  # noqa: E402
from kvpot.runtime.pot import Pot  # noqa: E402
from kvpot.train import edgeinfinite as te  # noqa: E402
from kvpot.train import edgeinfinite_torch as tt  # noqa: E402
from kvpot.train.edgeinfinite_emulate import engine_config  # noqa: E402
from kvpot.train.gguf_torch import forward, load_weights  # noqa: E402


def test_torch_memory_and_gate_equal_the_numpy_reference():
    rng = np.random.default_rng(0)
    H, n_head, dk, dv, T = 3, 9, 16, 16, 7
    L = 2
    gate = MemoryGate(layers=[0, 1], w1=rng.standard_normal((L, 8, dv)).astype(np.float32),
                      b1=rng.standard_normal((L, 8)).astype(np.float32),
                      w2=rng.standard_normal((L, dv, 8)).astype(np.float32),
                      b2=rng.standard_normal((L, dv)).astype(np.float32),
                      g=rng.standard_normal((L, n_head, dv)).astype(np.float32))
    m_np, z_np = np.zeros((H, dk, dv)), np.zeros((H, dk))
    m_t, z_t = torch.zeros(H, dk, dv, dtype=torch.float64), torch.zeros(H, dk, dtype=torch.float64)
    for _ in range(3):  # several folds
        k, v = rng.standard_normal((20, H, dk)), rng.standard_normal((20, H, dv))
        for h in range(H):
            m_np[h], z_np[h] = fold(m_np[h], z_np[h], k[:, h], v[:, h])
        m_t, z_t = tt.fold(m_t, z_t, torch.tensor(k), torch.tensor(v))
    np.testing.assert_allclose(m_t.numpy(), m_np, rtol=1e-10)
    np.testing.assert_allclose(z_t.numpy(), z_np, rtol=1e-10)
    q, a_dot = rng.standard_normal((T, n_head, dk)), rng.standard_normal((T, n_head, dv))
    a_mem = read(m_np, z_np, q)
    np.testing.assert_allclose(tt.read(m_t, z_t, torch.tensor(q)).numpy(), a_mem, rtol=1e-10)
    mod = tt.GateModule(gate)
    got = mod.mix(1, torch.tensor(a_mem, dtype=torch.float32), torch.tensor(a_dot, dtype=torch.float32))
    np.testing.assert_allclose(got.detach().numpy(), gate.mix(1, a_mem, a_dot), rtol=1e-4, atol=1e-4)


def _cpp_keys_and_last_logits(path, n_entries: int, n_tokens: int, layers, w):
    """llama.cpp's reading of the first n_tokens of a logbook in one ubatch: (tokens, {(layer, KV head): the
    cached K [n_tokens, head_dim]}, the last row's logits)."""
    model = LlamaModel(str(path))
    ctx = LlamaContext(model, ContextParams(n_ctx=max(128, n_tokens), n_batch=max(64, n_tokens), n_threads=2))
    try:
        tokens = model.tokenize(logbook(n_entries=n_entries, seed=4)[0])[:n_tokens]
        ctx.decode(tokens, 0, logits="last")
        pot = Pot(ctx)
        keys = {(il, h): pot.read(il, h, "k", 0, len(tokens), w.head_dim)
                for il in layers for h in range(w.n_head_kv)}
        return tokens, keys, ctx.logits_last()
    finally:
        ctx.close()
        model.close()


def test_torch_backbone_keys_and_logits_match_llama_cpp(smollm2_path):
    """The training forward sees the keys the cache holds (llama.cpp's RoPE form, same weights)."""
    w = load_weights(smollm2_path)
    tokens, keys, got = _cpp_keys_and_last_logits(smollm2_path, 2, 48, (0, 15, 29), w)
    with torch.no_grad():
        logits, kvs = forward(w, tokens, 0)
    for (il, h), k_cpp in keys.items():
        k_t = kvs[il][0][:, h].numpy()
        # llama.cpp multiplies Q4_1 weights by q8-quantized activations and stores K in f16
        assert np.abs(k_t - k_cpp).max() <= 0.05 * np.abs(k_cpp).max() + 1e-2
    want = logits[-1].numpy()
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert np.corrcoef(got, want)[0, 1] > 0.99


@pytest.fixture(scope="module")
def gemma_weights(gemma_path):
    return load_weights(gemma_path)


def _gemma_tokens(gemma_path, n: int) -> list[int]:
    model = LlamaModel(str(gemma_path), vocab_only=True)
    try:
        return model.tokenize(logbook(n_entries=40, seed=4)[0])[:n]
    finally:
        model.close()


def _cpp_logits(path, tokens: list[int], rows) -> np.ndarray:
    """llama.cpp's logits of `rows` for `tokens` decoded from position 0 (stock attention, one ubatch)."""
    model = LlamaModel(str(path))
    ctx = LlamaContext(model, ContextParams(n_ctx=1024, n_batch=1024, n_threads=2))
    try:
        ctx.decode(tokens, 0, logits="all")
        return np.stack([ctx.logits_row(i) for i in rows])
    finally:
        ctx.close()
        model.close()


def test_gemma3_forward_matches_llama_cpp_on_both_sides_of_the_window(gemma_path, gemma_weights):
    """Gemma-3: q/k norms, post norms, GELU, scaled embeddings, NEOX RoPE at 1e6 (global) and 1e4 (window
    layers), the window layers attending the last 512 tokens. Rows past the window tell a full-attention
    forward from the windowed one, so the check can fail."""
    w = gemma_weights
    assert w.pot_layers == [5, 11, 17] and w.n_swa == 512 and w.rope_base[0] == 1e4 and w.rope_base[5] == 1e6
    tokens = _gemma_tokens(gemma_path, 700)
    rows = [10, 300, 600, 699]
    want = _cpp_logits(gemma_path, tokens, rows)
    with torch.no_grad():
        logits, _ = forward(w, tokens, 0)
        full, _ = forward(dataclasses.replace(w, swa=[False] * w.n_layer), tokens, 0)  # same RoPE, no window
    for r, row in zip(rows, want):
        got = logits[r].numpy()
        assert int(np.argmax(got)) == int(np.argmax(row))
        assert np.corrcoef(got, row)[0, 1] > 0.99, r
    assert np.corrcoef(full[699].numpy(), want[-1])[0, 1] < 0.9  # without the window the last row is wrong


def test_gemma3_reading_step_windows_see_the_text_before(gemma_path, gemma_weights):
    """A reading-mode step with nothing folded and the gate closed is stock decoding of sink + run + chunk,
    with the run longer than the window so the window layers' prefix is trimmed to the last 512 tokens of
    text: its loss equals the one-pass forward's, and llama.cpp's within the quantized weights' noise."""
    w = gemma_weights
    cfg = te.TrainConfig(L_sink=8, L_seg=16, n_seg=0, L_window=560, L_chunk=64)
    tokens = _gemma_tokens(gemma_path, 8 + 560 + 64)
    gate = initial_memory_gate(gemma_path)
    closed = tt.GateModule(MemoryGate(layers=gate.layers, w1=gate.w1, b1=gate.b1, w2=gate.w2, b2=gate.b2,
                                      g=np.full_like(gate.g, -40.0)))
    with torch.no_grad():
        got = float(te.segment_loss(w, closed, tokens, cfg, leftover=0))
        logits, _ = forward(w, tokens, 0)
    one_pass = float(torch.nn.functional.cross_entropy(logits[568:631], torch.as_tensor(tokens[569:632])))
    assert abs(got - one_pass) < 1e-4 * one_pass
    rows = list(range(568, 631))
    logits = _cpp_logits(gemma_path, tokens, rows)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    want = -float(np.mean([logp[i, tokens[r + 1]] for i, r in enumerate(rows)]))
    assert abs(got - want) < 0.06 * want, (got, want)  # llama.cpp's weights meet q8 activations (3.7 % here)


def test_qwen2_forward_matches_llama_cpp_with_its_biases(qwen05_cut_path):
    """Qwen2: biases on Q, K and V added before NEOX RoPE at base 1e6, tied embeddings (on the model's first
    4 blocks: each layer's arithmetic is the same). The keys equal the cache's and the logits llama.cpp's;
    the same forward with the K and Q biases left out is far from them, so the check can fail."""
    w = load_weights(qwen05_cut_path)
    assert w.neox and w.rope_base[0] == 1e6 and (w.n_head, w.n_head_kv, w.n_layer) == (14, 2, 4)
    tokens, keys, got = _cpp_keys_and_last_logits(qwen05_cut_path, 8, 160, (0, 1, 3), w)
    unbiased = dataclasses.replace(w, tensors={k: v for k, v in w.tensors.items()
                                               if not k.endswith(("attn_q.bias", "attn_k.bias"))})
    with torch.no_grad():
        logits, kvs = forward(w, tokens, 0)
        wrong, wrong_kvs = forward(unbiased, tokens, 0)
    for (il, h), k_cpp in keys.items():
        tol = 0.05 * np.abs(k_cpp).max() + 1e-2  # Q4_K weights meet q8 activations; K stored in f16
        assert np.abs(kvs[il][0][:, h].numpy() - k_cpp).max() <= tol, (il, h)
        assert np.abs(wrong_kvs[il][0][:, h].numpy() - k_cpp).max() > tol, (il, h)
    assert int(np.argmax(got)) == int(np.argmax(logits[-1].numpy()))
    assert np.corrcoef(got, logits[-1].numpy())[0, 1] > 0.99
    assert np.corrcoef(got, wrong[-1].numpy())[0, 1] < 0.9


def test_a_short_training_run_writes_a_gate_for_the_model(smollm2_path, gemma_path, tmp_path):
    out = tmp_path / "gate.gguf"
    cfg = te.TrainConfig(L_sink=4, L_seg=16, n_seg=2, steps=2, lr=0.05, seed=1)
    logs: list[str] = []
    summary = te.train(smollm2_path, out, cfg, log=logs.append)
    assert np.isfinite(summary["first_loss"]) and np.isfinite(summary["last_loss"])
    assert any("loss" in line for line in logs)
    gate = read_memory_gate(out, model=smollm2_path)
    init = initial_memory_gate(smollm2_path)
    assert gate.layers == init.layers and not np.array_equal(gate.g, init.g)  # the gate learned
    with pytest.raises(AdapterError, match="another model"):
        read_memory_gate(out, model=gemma_path)


def test_gate_logits_have_their_own_rate(smollm2_path, tmp_path):
    """--lr-g: Adam moves each parameter by about its rate a step, so g moves ~lr_g while W1, W2 stay put."""
    out = tmp_path / "gate.gguf"
    te.train(smollm2_path, out, te.TrainConfig(L_sink=4, L_seg=16, n_seg=2, steps=2, lr=1e-6, lr_g=0.05, seed=1),
             log=lambda s: None)
    gate, init = read_memory_gate(out, model=smollm2_path), initial_memory_gate(smollm2_path)
    assert 0.05 < np.abs(gate.g - init.g).max() <= 0.101  # f32 near -4 rounds a step of 0.05 to ~0.05003
    assert np.abs(gate.w1 - init.w1).max() <= 2.1e-6


def test_reading_mode_step_sees_sink_and_unfolded_run_at_their_cache_positions(smollm2_path):
    """Reading mode: with the gate closed the chunk's loss is the stock forward's over sink + unfolded run +
    chunk contiguous from position 0 (the folded segments leave the cache); an open gate changes it."""
    w = load_weights(smollm2_path)
    cfg = te.TrainConfig(L_sink=4, L_seg=16, n_seg=2, L_window=3, L_chunk=8)
    leftover = 5
    model = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        tokens = model.tokenize(logbook(n_entries=6, seed=2)[0])[:te.window_length(cfg)]
    finally:
        model.close()
    assert len(tokens) == te.window_length(cfg) == 4 + 32 + 3 + 8 + 8
    gate = initial_memory_gate(smollm2_path)
    closed = tt.GateModule(MemoryGate(layers=gate.layers, w1=gate.w1, b1=gate.b1, w2=gate.w2, b2=gate.b2,
                                      g=np.full_like(gate.g, -40.0)))
    seen = tokens[:4] + tokens[36:36 + 3 + leftover]   # sink, then the unfolded run after the 2 folded segments
    chunk = tokens[36 + 3 + leftover:36 + 3 + leftover + 8]
    with torch.no_grad():
        got = te.segment_loss(w, closed, tokens, cfg, leftover=leftover)
        logits, _ = forward(w, seen + chunk, 0)
        want = torch.nn.functional.cross_entropy(logits[len(seen):-1], torch.as_tensor(chunk[1:]))
        opened = te.segment_loss(w, tt.GateModule(gate), tokens, cfg, leftover=leftover)
    assert abs(float(got) - float(want)) < 1e-4 * float(want)
    assert abs(float(opened) - float(want)) > 1e-4 * float(want)  # the memory of the folded segments is read


@pytest.mark.parametrize(("args", "needle"), [
    (["--n-seg", "1"], "n-seg"),
    (["--data", "poems"], "--data must be code or mixed"),
    (["--budget", "1024"], "need --l-chunk"),
    (["--l-chunk", "64", "--n-chunks", "3"], "--n-chunks needs --budget"),
    (["--l-chunk", "512", "--budget", "60"], "budget 60"),  # less than the memory (65 cells)
])
def test_cli_refuses_bad_arguments_in_one_line(smollm2_path, tmp_path, args, needle):
    out = tmp_path / "g.gguf"
    res = run_cli("train", "edgeinfinite", "-m", str(smollm2_path), "-o", str(out), "--steps", "0", *args)
    assert res.returncode != 0
    assert_one_line_error(res.stderr, needle)
    assert not out.exists()


def test_zero_steps_writes_the_untrained_gate(smollm2_path, tmp_path):
    """--steps 0 writes the gate the ablation calls gate=init, and says so instead of a loss of nan."""
    out = tmp_path / "g0.gguf"
    res = run_cli("train", "edgeinfinite", "-m", str(smollm2_path), "-o", str(out), "--steps", "0", "-t", "1")
    assert res.returncode == 0, res.stderr
    said = " ".join(res.stderr.split())  # rich wraps long lines
    assert "untrained memory gate" in said and "nan" not in said
    got, want = read_memory_gate(out, model=smollm2_path), initial_memory_gate(smollm2_path)
    for name in ("w1", "b1", "w2", "b2", "g"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


def test_mixed_data_alternates_code_and_licence_prose():
    """--data mixed: code and prose windows in turn; the prose is base-files' licences, each file once."""
    code, prose = iter([[1], [2], [3]]), iter([[10], [20], [30]])
    assert [next(w) for w in [te.alternate(code, prose)] * 4] == [[1], [10], [2], [20]]
    root = Path("/usr/share/common-licenses")
    if not root.is_dir():  # not a Debian-based machine: one clear error, not an empty corpus
        with pytest.raises(KvpotError, match="no prose to train on"):
            te.prose_sources()
        return
    files = te.prose_sources()
    assert files and all(not f.is_symlink() and f.stat().st_size >= 10_000 for f in files)
    assert len({f.resolve() for f in files}) == len(files)
    assert [f.stat().st_size for f in files] == sorted((f.stat().st_size for f in files), reverse=True)


class _Recording(EdgeInfinite):
    """EdgeInfinite that keeps each chunk's per-token log-probabilities as the engine hands them over."""

    def after_chunk(self, view):
        self.__dict__.setdefault("chunk_logprobs", []).append(np.array(view.logprobs))
        super().after_chunk(view)


def test_engine_mode_step_is_the_engines_reading(smollm2_path, tmp_path):
    """--budget: the step reads a window as `kvpot bench ppl` does (the policy's fit, chunks, folds of the
    oldest cells after the sink, CR-RoPE). The trained chunk's loss equals the engine's on the same tokens,
    gate closed (eviction alone: the kept cells and their positions) and half open (the memory of every
    fold), within llama.cpp's q8 activations; and the memory's effect (open - closed) is the engine's."""
    budget, chunk = 256, 64
    cfg = engine_config(smollm2_path, te.TrainConfig(budget=budget, L_chunk=chunk))
    assert (cfg.L_sink, cfg.L_window, cfg.L_seg, cfg.mem_cells, cfg.n_chunks) == (22, 168, 1, 65, 8)
    model = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        bos = model.bos()
        doc = model.tokenize(logbook(n_entries=40, seed=3)[0])[:te.window_length(cfg) - len(bos)]
    finally:
        model.close()
    init = initial_memory_gate(smollm2_path)
    w = load_weights(smollm2_path)
    got, want = {}, {}
    for name, g in (("closed", -40.0), ("half", 0.0)):
        gate = dataclasses.replace(init, g=np.full_like(init.g, g))
        path = tmp_path / f"{name}.gguf"
        write_memory_gate(path, gate)
        with torch.no_grad():
            got[name] = float(te.segment_loss(w, tt.GateModule(gate), bos + doc, cfg))
        policy = _Recording(gate=str(path))
        with Engine(str(smollm2_path), policy, EngineConfig(budget=budget, chunk=chunk, n_threads=2,
                                                              measure_nll=True)) as eng:
            eng.feed(doc)
            assert eng.n_compactions >= 3  # several folds before the trained chunk
        last = policy.chunk_logprobs[-1]
        assert len(policy.chunk_logprobs) == cfg.n_chunks + 1 and len(last) == chunk
        want[name] = -float(np.mean(last[1:]))  # [0] was predicted by the chunk before
    # measured here (with fit's geometry: sink 22, window 168, segments of 1): 0.3 % apart gate closed, 0.2 %
    # half open; a window 32 cells longer moves the emulated loss by 11 % (closed) and 4.5 % (half), segments
    # of 16 (window 15 shorter) by 2.3 % and 1.7 %, a sink of 4 (window 18 longer) by 9.1 % and 4.5 %, so 1 %
    # tells the engine's geometry from those near misses (segments of 4, 3 cells fewer, read within 0.4 %)
    for name in got:
        assert abs(got[name] - want[name]) < 0.01 * want[name], (name, got, want)
    effect_got, effect_want = got["half"] - got["closed"], want["half"] - want["closed"]
    assert abs(effect_want) > 0.1 * want["closed"]  # the memory matters here, so the check can fail
    assert abs(effect_got - effect_want) < 0.03 * abs(effect_want), (got, want)
