"""`kvpot train locret`: the capture of features and labels from llama.cpp against references computed
here from tensors caught in the same run (cb_eval, test oracle), a real (tiny) training run whose loss
falls from its own start, and the exported adapter scoring in the graph as the torch model does."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from potlib import TensorCatcher

from kvpot.bench.logbook import logbook
from kvpot.converters.adapter import BaseIdentity, read_retaining_heads, write_retaining_heads
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot
from kvpot.train.documents import list_files, make_sample, make_samples
from kvpot.train.locret_capture import Capturer, causal_importance


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs")
    for i in range(3):
        doc, _, _ = logbook(n_entries=80, seed=100 + i, fact_at=2.0)  # fact_at > 1: no strongbox fact
        (d / f"log{i}.txt").write_text(doc)
    return d


def brute_force_labels(q_post: np.ndarray, k_post: np.ndarray, scale: float, n_prompt: int) -> np.ndarray:
    """q_post [T, n_head, d], k_post [T, n_head_kv, d] (after RoPE): for each prompt key and KV head,
    the largest scale * q·k over the answer rows and the group's query heads, one dot at a time."""
    T, n_head, _ = q_post.shape
    n_head_kv = k_post.shape[1]
    group = n_head // n_head_kv
    out = np.full((n_prompt, n_head_kv), -np.inf)
    for j in range(n_head_kv):
        for k in range(n_prompt):
            for p in range(n_prompt, T):
                for h in range(j * group, (j + 1) * group):
                    out[k, j] = max(out[k, j], scale * float(np.dot(q_post[p, h].astype(np.float64),
                                                                    k_post[k, j].astype(np.float64))))
    return out


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_captured_features_and_labels_equal_references(which, request, text_dir):
    path = request.getfixturevalue("smollm2_path" if which == "smollm2" else "gemma_path")
    base = BaseIdentity.of_model(path)
    model = LlamaModel(str(path))
    try:
        sample = make_sample(model, list_files([text_dir]), 160, random.Random(5), "retrieval")
        T, n_prompt = len(sample.tokens), sample.n_prompt
        assert 0 < n_prompt < T
        got = {}
        for first in (True, False):  # first: the projections (features); last: after RoPE (labels)
            names = {f"{n}-{il}" for il in range(base.n_layer) for n in ("Qcur", "Kcur", "Vcur")}
            catcher = TensorCatcher(names, first=first)
            ctx = LlamaContext(model, ContextParams(n_ctx=256, n_batch=256, n_threads=2), cb_eval=catcher.callback)
            try:
                pot = Pot(ctx)
                layer_ids = list(pot.layer_ids)
                got[first] = (Capturer(ctx, pot, base, 256).run(sample), catcher.caught)
            finally:
                ctx.close()
    finally:
        model.close()
    cap, caught = got[True]
    assert cap.x.shape == (len(layer_ids), n_prompt, base.qkv_width())
    assert cap.y.shape == (len(layer_ids), n_prompt, base.n_head_kv)
    # Gemma-3 holds only its global layers in the pot; SmolLM2 all of them
    assert len(layer_ids) == (base.n_layer if which == "smollm2" else base.n_layer // 6)
    for i, il in enumerate(layer_ids):
        # features: the heads' input, [Q; K; V] projections before RoPE (and before Gemma's q/k norm)
        qkv = np.concatenate([caught[f"{n}-{il}"].reshape(T, -1) for n in ("Qcur", "Kcur", "Vcur")], axis=1)
        np.testing.assert_allclose(cap.x[i].astype(np.float32), qkv[:n_prompt], rtol=1e-3,
                                   atol=1e-3 * np.abs(qkv).max())
    _, post = got[False]
    # SmolLM2: kq_scale 1/sqrt(64); Gemma-3-270M scales Q by query_pre_attn_scalar^-1/2 = 1/sqrt(256)
    scale = 1.0 / np.sqrt(base.head_dim_k)
    for i, il in enumerate(layer_ids[:: max(1, len(layer_ids) // 3)]):
        q = post[f"Qcur-{il}"].reshape(T, base.n_head, base.head_dim_k)
        k = post[f"Kcur-{il}"].reshape(T, base.n_head_kv, base.head_dim_k)
        want = brute_force_labels(q, k, scale, n_prompt)
        # the pot stores K in f16: agreement to f16 precision of the dot products
        np.testing.assert_allclose(cap.y[layer_ids.index(il)], want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_causal_importance_takes_the_max_over_rows_and_group():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 6, 8)).astype(np.float32)   # 4 rows, 6 query heads
    k = rng.standard_normal((5, 2, 8)).astype(np.float32)   # 5 keys, 2 KV heads: groups of 3
    got = causal_importance(q, k)
    for j in range(2):
        for key in range(5):
            want = max(float(q[p, h] @ k[key, j]) for p in range(4) for h in range(3 * j, 3 * j + 3))
            assert got[key, j] == pytest.approx(want, rel=1e-5)


def test_samples_are_fixed_by_seed_and_hold_their_answer(smollm2_path, text_dir):
    model = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        a = make_samples(model, [text_dir], 4, 200, seed=3)
        b = make_samples(model, [text_dir], 4, 200, seed=3)
        c = make_samples(model, [text_dir], 4, 200, seed=4)
        assert [s.tokens for s in a] == [s.tokens for s in b]
        assert [s.tokens for s in a] != [s.tokens for s in c]
        assert [s.kind for s in a] == ["retrieval", "continuation"] * 2
        for s in a:
            assert len(s.tokens) <= 200 and 0 < s.n_prompt < len(s.tokens)
        # a retrieval sample's answer repeats a fact that sits in its prompt
        r = a[0]
        answer = b"".join(model.piece(t) for t in r.tokens[r.n_prompt:]).decode()
        prompt = b"".join(model.piece(t) for t in r.tokens[:r.n_prompt]).decode()
        value = answer.split(".")[0].strip()
        assert value.isdigit() and f" is {value}.\n" in prompt
    finally:
        model.close()


def test_tiny_training_run_lowers_its_loss_and_scores_in_graph_as_torch_does(smollm2_path, text_dir, tmp_path):
    import torch  # the `train` extra: `make test` installs it (train-deps), so this test never skips

    from kvpot.train.locret import capture_all
    from kvpot.train.locret_fit import FitConfig, evaluate, fit, to_heads

    base = BaseIdentity.of_model(smollm2_path)
    vocab = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        samples = make_samples(vocab, [text_dir], 2, 160, seed=1)
    finally:
        vocab.close()
    data, layer_ids = capture_all(smollm2_path, samples, base, threads=2, cache=tmp_path / "cache")
    # a rerun reads the captures back instead of decoding again
    assert len(list((tmp_path / "cache").glob("locret-*.npz"))) == len(samples)
    again, _ = capture_all(smollm2_path, samples, base, threads=2, cache=tmp_path / "cache")
    for a, b in zip(data, again):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
    cfg = FitConfig(hidden=8, steps=40, lr=1e-2, seed=0)
    model, losses = fit(data, base, layer_ids, cfg)
    assert len(losses) == 40 and np.isfinite(losses).all()
    init, _ = fit(data, base, layer_ids, FitConfig(hidden=8, steps=1, lr=0.0, seed=0))  # the same start, unmoved
    before, after = evaluate(init, data, cfg.alpha), evaluate(model, data, cfg.alpha)
    assert after < 0.8 * before, (before, after)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])

    out = tmp_path / "heads.gguf"
    write_retaining_heads(out, to_heads(model, base, layer_ids), dtype="f32")
    heads = read_retaining_heads(out, model=smollm2_path)
    llm = LlamaModel(str(smollm2_path))
    ctx = LlamaContext(llm, ContextParams(n_ctx=256, n_batch=256, n_threads=2))
    try:
        pot = Pot(ctx)
        pot.set_heads(heads)
        s, cap = samples[0], data[0]
        ctx.decode(s.tokens, 0, logits="last")
        with torch.no_grad():
            want = model(torch.from_numpy(cap.x.astype(np.float32))).numpy()  # torch on the captured features
        for i, il in enumerate(layer_ids):
            got = pot.take_head_scores(il, len(s.tokens))[:s.n_prompt]
            # the captured features are stored in f16; the graph reads them in f32
            np.testing.assert_allclose(got, want[i], rtol=1e-2, atol=1e-2 * np.abs(want[i]).max())
    finally:
        ctx.close()
        llm.close()


def test_train_cli_is_one_line_without_torch(tmp_path, smollm2_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('no torch here')\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH", "")]))}
    res = run_cli("train", "locret", "-m", str(smollm2_path), "-o", str(tmp_path / "h.gguf"), env=env)
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "training needs torch")
    res = run_cli("train", "locret", "-m", str(smollm2_path), "-o", str(tmp_path / "h.bin"))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "expected a .gguf")
    res = run_cli("train", "locret", "-m", str(smollm2_path), "-o", str(tmp_path / "h.gguf"), "--data",
                  str(tmp_path / "missing"))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "does not exist")
