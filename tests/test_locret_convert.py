"""Locret's published retaining heads -> kvpot adapter GGUF: the weights-only checkpoint reader, the
converter's refusals, and the adapter's identity checks. Checkpoints are written here in the exact
published layout (keys, bf16, torch.save's zip archive) for the test models' shapes."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from torch_ckpt import to_bf16_bits, write_checkpoint

from kvpot.converters.adapter import AdapterError, BaseIdentity, read_retaining_heads
from kvpot.converters.locret import convert_locret
from kvpot.converters.torch_checkpoint import CheckpointError, read_state_dict

HIDDEN = 16


def bf16(a: np.ndarray) -> np.ndarray:
    """What a bf16 checkpoint holds for a float32 array, back in float32."""
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def published_layout(base: BaseIdentity, seed: int = 0, hidden: int = HIDDEN) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for il in range(base.n_layer):
        out[f"model.layers.{il}.self_attn.fc1.weight"] = rng.standard_normal((hidden, base.qkv_width()),
                                                                            dtype=np.float32) * 0.05
        out[f"model.layers.{il}.self_attn.fc2.weight"] = rng.standard_normal((base.n_head_kv, hidden),
                                                                            dtype=np.float32) * 0.05
    return out


@pytest.fixture(scope="module")
def smol_base(smollm2_path) -> BaseIdentity:
    return BaseIdentity.of_model(smollm2_path)


def test_identity_of_the_test_models(smol_base, gemma_path):
    # SmolLM2-135M: 30 layers, 9 heads / 3 KV heads of 64 -> Locret's input is (9 + 2*3) * 64 wide
    assert (smol_base.n_layer, smol_base.n_head, smol_base.n_head_kv, smol_base.head_dim_k) == (30, 9, 3, 64)
    assert smol_base.qkv_width() == (9 + 2 * 3) * 64
    gemma = BaseIdentity.of_model(gemma_path)
    assert (gemma.n_layer, gemma.n_head, gemma.n_head_kv, gemma.head_dim_k) == (18, 4, 1, 256)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute, on q_proj (n_head) and k_proj (n_head_kv) rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_columns(base: BaseIdentity) -> np.ndarray:
    """For a llama-arch base: [Q; K; V]_gguf = [Q; K; V]_hf[cols] (llama_permute on the row indices; V stays)."""
    d = base.head_dim_k
    nq, nk = base.n_head * d, base.n_head_kv * d
    return np.concatenate([llama_permute(np.arange(nq), base.n_head), nq + llama_permute(np.arange(nk), base.n_head_kv),
                           np.arange(nq + nk, base.qkv_width())])


def test_convert_keeps_the_published_weights_and_scores(smol_base, smollm2_path, tmp_path):
    weights = published_layout(smol_base)
    ckpt = tmp_path / "smollm2-135m.bin"
    write_checkpoint(ckpt, weights)
    out = tmp_path / "heads.gguf"
    convert_locret(ckpt, smollm2_path, out)
    heads = read_retaining_heads(out, model=smollm2_path)
    assert heads.hidden == HIDDEN and heads.activation == "silu"
    cols = gguf_columns(smol_base)
    rng = np.random.default_rng(1)
    for il in (0, 17, 29):
        w1 = bf16(weights[f"model.layers.{il}.self_attn.fc1.weight"])
        w2 = bf16(weights[f"model.layers.{il}.self_attn.fc2.weight"])
        np.testing.assert_array_equal(heads.fc1[il][:, np.argsort(cols)], w1)  # bf16 kept bit for bit, Q/K reordered
        np.testing.assert_array_equal(heads.fc2[il], w2)
        # the module the checkpoint came from: fc2(silu(fc1(x))) on [Q; K; V] in the HF layout, while the
        # graph hands the heads the GGUF's Q and K
        x = rng.standard_normal((5, smol_base.qkv_width()))
        h = x @ w1.astype(np.float64).T
        want = (h / (1 + np.exp(-h))) @ w2.astype(np.float64).T
        np.testing.assert_allclose(heads.scores(il, x[:, cols]), want, rtol=1e-12, atol=1e-12)


def exact_layout(base: BaseIdentity, seed: int) -> dict[str, np.ndarray]:
    """Weights that bf16 holds exactly and whose products with small integers float64 sums exactly, so two
    orders of summation agree to the bit: k / 2**14 for integer k in [-127, 127] (small enough that the
    heads' hidden values stay within a few units, where silu is not saturated)."""
    rng = np.random.default_rng(seed)
    return {f"model.layers.{il}.self_attn.{fc}.weight": rng.integers(-127, 128, shape).astype(np.float32) / 2**14
            for il in range(base.n_layer)
            for fc, shape in (("fc1", (HIDDEN, base.qkv_width())), ("fc2", (base.n_head_kv, HIDDEN)))}


def test_llama_gguf_q_and_k_rows_are_permuted_for_the_heads(smol_base, smollm2_path, tmp_path):
    """llama.cpp's converter reorders each head's q/k rows for the llama architecture (its RoPE rotates
    adjacent pairs); the published heads were trained on the HF layout (rotate_half: first half, second half).
    The converted heads on the GGUF's Q/K must score what the published ones score on HF's Q/K."""
    assert smol_base.arch == "llama"
    weights = exact_layout(smol_base, seed=5)
    write_checkpoint(tmp_path / "smol.bin", weights)
    convert_locret(tmp_path / "smol.bin", smollm2_path, tmp_path / "heads.gguf")
    heads = read_retaining_heads(tmp_path / "heads.gguf", model=smollm2_path)
    b = smol_base
    nq, nk = b.n_head * b.head_dim_k, b.n_head_kv * b.head_dim_k
    # one layer's q/k/v projections as the checkpoint's model has them and as the GGUF holds them, applied to
    # a few tokens' normed inputs (small integers throughout: every product and sum below is exact)
    rng = np.random.default_rng(6)
    n_embd = 24
    wq, wk, wv = (rng.integers(-3, 4, (n, n_embd)).astype(np.float64) for n in (nq, nk, nk))
    x = rng.integers(-3, 4, (7, n_embd)).astype(np.float64)
    qkv_hf = np.concatenate([x @ wq.T, x @ wk.T, x @ wv.T], axis=1)
    qkv_gguf = np.concatenate([x @ llama_permute(wq, b.n_head).T, x @ llama_permute(wk, b.n_head_kv).T, x @ wv.T],
                              axis=1)
    np.testing.assert_array_equal(qkv_gguf, qkv_hf[:, gguf_columns(b)])
    for il in (0, 11, 29):
        w1 = weights[f"model.layers.{il}.self_attn.fc1.weight"].astype(np.float64)
        w2 = weights[f"model.layers.{il}.self_attn.fc2.weight"].astype(np.float64)
        # the two layouts differ for this weight, in Q and in K: fc1 copied as published would be caught
        assert not np.array_equal(qkv_gguf[:, :nq] @ w1[:, :nq].T, qkv_hf[:, :nq] @ w1[:, :nq].T)
        assert not np.array_equal(qkv_gguf[:, nq:nq + nk] @ w1[:, nq:nq + nk].T, qkv_hf[:, nq:nq + nk] @ w1[:, nq:nq + nk].T)
        h = qkv_hf @ w1.T
        np.testing.assert_array_equal(qkv_gguf @ heads.fc1[il].astype(np.float64).T, h)
        np.testing.assert_array_equal(heads.scores(il, qkv_gguf), (h / (1 + np.exp(-h))) @ w2.T)


def test_gemma3_gguf_keeps_the_hf_layout(gemma_path, tmp_path):
    """gemma3 (like qwen2, qwen3, phi3) rotates halves in llama.cpp as in HF: no row is moved, nor any column."""
    base = BaseIdentity.of_model(gemma_path)
    assert base.arch == "gemma3"
    weights = exact_layout(base, seed=7)
    write_checkpoint(tmp_path / "gemma.bin", weights)
    convert_locret(tmp_path / "gemma.bin", gemma_path, tmp_path / "heads.gguf")
    heads = read_retaining_heads(tmp_path / "heads.gguf", model=gemma_path)
    for il in range(base.n_layer):
        np.testing.assert_array_equal(heads.fc1[il], weights[f"model.layers.{il}.self_attn.fc1.weight"])
        np.testing.assert_array_equal(heads.fc2[il], weights[f"model.layers.{il}.self_attn.fc2.weight"])


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda w: w.update({"model.embed_tokens.weight": np.zeros((2, 2), np.float32)}), "unexpected key"),
    (lambda w: w.pop("model.layers.7.self_attn.fc2.weight"), "layer 7 has no fc2"),
    (lambda w: w.pop("model.layers.29.self_attn.fc1.weight"), "layer 29 has no fc1"),
    (lambda w: w.update({"model.layers.3.self_attn.fc1.weight": np.zeros((HIDDEN, 100), np.float32)}), "layer 3: fc1 is"),
    (lambda w: w.update({"model.layers.30.self_attn.fc1.weight": np.zeros((HIDDEN, 960), np.float32)}), "layer 30"),
])
def test_converter_refuses_what_the_official_loader_would_ignore(smol_base, smollm2_path, tmp_path, damage, needle):
    weights = published_layout(smol_base)
    damage(weights)
    ckpt = tmp_path / "bad.bin"
    write_checkpoint(ckpt, weights)
    with pytest.raises(AdapterError, match=needle):
        convert_locret(ckpt, smollm2_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_heads_for_one_model_do_not_convert_for_another(smol_base, gemma_path, tmp_path):
    ckpt = tmp_path / "smol.bin"
    write_checkpoint(ckpt, published_layout(smol_base))
    with pytest.raises(AdapterError, match="is the checkpoint for this model"):
        convert_locret(ckpt, gemma_path, tmp_path / "out.gguf")


def test_adapter_for_another_model_is_refused(smol_base, smollm2_path, gemma_path, tmp_path):
    ckpt = tmp_path / "smol.bin"
    write_checkpoint(ckpt, published_layout(smol_base))
    out = tmp_path / "heads.gguf"
    convert_locret(ckpt, smollm2_path, out)
    with pytest.raises(AdapterError, match="was made for another model .*arch llama .*gemma3"):
        read_retaining_heads(out, model=gemma_path)
    # same shapes, other weights: a copy of the base with one byte changed has another sha256
    twin = tmp_path / "twin.gguf"
    data = bytearray(Path(smollm2_path).read_bytes())
    data[-1] ^= 0xFF
    twin.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match="sha256"):
        read_retaining_heads(out, model=twin)


def test_damaged_adapters_are_refused(smol_base, smollm2_path, tmp_path):
    ckpt = tmp_path / "smol.bin"
    write_checkpoint(ckpt, published_layout(smol_base))
    good = tmp_path / "heads.gguf"
    convert_locret(ckpt, smollm2_path, good)
    raw = good.read_bytes()
    for name, data in {"truncated-header": raw[:200], "truncated-tensors": raw[: len(raw) - 1000],
                       "empty": b"", "not-gguf": b"PK\x03\x04" + raw[4:]}.items():
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(AdapterError if name == "truncated-tensors" else Exception) as info:
            read_retaining_heads(bad, model=smollm2_path)
        assert "Traceback" not in str(info.value) and "\n" not in str(info.value), (name, info.value)
        from kvpot.errors import KvpotError
        assert isinstance(info.value, KvpotError), (name, type(info.value), info.value)


# ---------------------------------------------------------------- the weights-only reader


def _pickle_with(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def test_reader_never_runs_what_a_checkpoint_asks_for(tmp_path):
    marker = tmp_path / "ran"
    # os.system("touch MARKER") as a pickle: GLOBAL, argument tuple, REDUCE
    cmd = f"touch {marker}".encode()
    evil = _pickle_with(b"cos\nsystem\n(X" + struct.pack("<I", len(cmd)) + cmd + b"tR")
    for body in (evil, _pickle_with(b"cbuiltins\neval\n(X\x04\x00\x00\x001+1tR")):
        ckpt = tmp_path / "evil.bin"
        write_checkpoint(ckpt, {}, pickle_bytes=body)
        with pytest.raises(CheckpointError, match="weights-only reader does not load"):
            read_state_dict(ckpt)
    assert not marker.exists()


def test_reader_refuses_foreign_and_broken_files(tmp_path):
    cases = {
        "plain-pickle.bin": b"\x80\x02}q\x00.",                  # legacy / not a zip
        "empty.bin": b"",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match="zip format"):
            read_state_dict(tmp_path / name)
    # a storage shorter than the tensor it backs
    ok = tmp_path / "ok.bin"
    write_checkpoint(ok, {"w": np.ones((4, 4), np.float32)})
    short = tmp_path / "short.bin"
    with zipfile.ZipFile(ok) as src, zipfile.ZipFile(short, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            dst.writestr(item, data[:-2] if item.endswith("data/0") else data)
    with pytest.raises(CheckpointError, match="bytes, expected"):
        read_state_dict(short)
    # a persistent id that is not a storage
    odd = tmp_path / "odd.bin"
    write_checkpoint(odd, {}, pickle_bytes=_pickle_with(b"(X\x03\x00\x00\x00fooX\x03\x00\x00\x00bartQ"))
    with pytest.raises(CheckpointError, match="does not read"):
        read_state_dict(odd)


def test_reader_reads_each_dtype_torch_writes(tmp_path):
    rng = np.random.default_rng(3)
    a32 = rng.standard_normal((3, 5)).astype(np.float32)
    a16 = rng.standard_normal((2, 7)).astype(np.float16)
    path = tmp_path / "f.bin"
    write_checkpoint(path, {"a": a32, "b": a16}, bf16=False)
    got = read_state_dict(path)
    np.testing.assert_array_equal(got["a"], a32)
    np.testing.assert_array_equal(got["b"], a16)


def test_convert_cli_is_one_line_on_bad_input(smollm2_path, tmp_path):
    (tmp_path / "notes.bin").write_text("not a checkpoint")
    res = run_cli("convert", "locret", str(tmp_path / "notes.bin"), "--base", str(smollm2_path),
                  "-o", str(tmp_path / "o.gguf"))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "zip format")
    assert not (tmp_path / "o.gguf").exists()


def test_reader_agrees_with_real_torch_save():
    """tests/data/locret-tiny.torch.bin was written by torch.save itself (the script beside it);
    its values are recomputed here from the same formula and rounded to bf16 as torch does."""
    got = read_state_dict(Path(__file__).parent / "data" / "locret-tiny.torch.bin")

    def value(layer: int, which: int, i: int, j: int) -> float:
        return ((layer * 131 + which * 71 + i * 13 + j * 7) % 97 - 48) / 37.0

    shapes = {1: (4, 6), 2: (3, 4)}
    assert sorted(got) == sorted(f"model.layers.{il}.self_attn.fc{w}.weight" for il in range(2) for w in (1, 2))
    for il in range(2):
        for which, (rows, cols) in shapes.items():
            want = np.array([[value(il, which, i, j) for j in range(cols)] for i in range(rows)], dtype=np.float32)
            np.testing.assert_array_equal(got[f"model.layers.{il}.self_attn.fc{which}.weight"], bf16(want))
