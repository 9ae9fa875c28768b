"""The Locret policy: Algorithm 1's selection against a loop reference, its refusals, and a run on
the pot with retaining heads converted from a checkpoint in the published layout."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli, unknown_twin
from torch_ckpt import write_checkpoint

from kvpot.bench.logbook import logbook
from kvpot.converters.adapter import BaseIdentity
from kvpot.converters.locret import convert_locret
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import Locret, PotView, make_policy
from kvpot.policies.base import BudgetTooSmall


def reference_keep(positions: np.ndarray, score: np.ndarray, budget: int, n_s: int) -> np.ndarray:
    """Per (layer, head), with plain loops: the n_s newest cells, then the highest scores among the
    others (ties to the lower cell index) until `budget` cells."""
    L, H, N = positions.shape
    out = np.zeros((L, H, budget), dtype=np.int64)
    for l in range(L):
        for h in range(H):
            by_age = sorted(range(N), key=lambda c: positions[l, h, c])
            kept = set(by_age[N - n_s:]) if n_s else set()
            rest = sorted((c for c in range(N) if c not in kept), key=lambda c: (-score[l, h, c], c))
            kept |= set(rest[: budget - len(kept)])
            out[l, h] = sorted(kept)
    return out


def test_selection_matches_algorithm_1_over_chunks():
    rng = np.random.default_rng(0)
    L, H, budget, chunk, n_s = 3, 2, 40, 16, 9
    pol = Locret(heads="unused.gguf", n_s=n_s)
    positions = np.zeros((L, H, 0), dtype=np.int64)
    scores_all = np.zeros((L, H, 0), dtype=np.float32)
    seen = 0
    for _ in range(7):
        new_pos = np.broadcast_to(np.arange(seen, seen + chunk), (L, H, chunk))
        new_scores = rng.standard_normal((L, H, chunk)).astype(np.float32)
        new_scores[0, 0, :3] = new_scores[0, 0, 3]  # ties
        positions = np.concatenate([positions, new_pos], axis=2)
        scores_all = np.concatenate([scores_all, new_scores], axis=2)
        seen += chunk
        view = PotView(n_layer=L, n_head_kv=H, n_cells=positions.shape[2], positions=positions, scores=None,
                       logprobs=None, chunk_positions=np.arange(seen - chunk, seen), tokens_seen=seen,
                       head_scores=new_scores)
        pol.after_chunk(view)
        keep = pol.select(view, budget)
        if positions.shape[2] <= budget:
            assert keep is None
            continue
        np.testing.assert_array_equal(keep, reference_keep(positions, scores_all, budget, n_s))
        positions = np.take_along_axis(positions, keep, axis=2)
        scores_all = np.take_along_axis(scores_all, keep, axis=2)
        pol.after_compaction(keep)
    # per head really: the heads of a layer keep different tokens
    assert not np.array_equal(positions[0, 0], positions[0, 1])


def test_refusals_are_one_line():
    with pytest.raises(BudgetTooSmall, match="must exceed the stabilizer length"):
        Locret(heads="x", n_s=64).stabilizers(64)
    with pytest.raises(BudgetTooSmall, match="must exceed the stabilizer length"):
        Locret(heads="x", n_s=64).fit(64, 32)
    Locret(heads="x", n_s=64).fit(65, 32)
    with pytest.raises(KvpotError, match="n_s must be"):
        make_policy("locret:n_s=-1")
    with pytest.raises(KvpotError, match="locret needs retaining heads"):
        Locret().retaining_heads("model.gguf")
    assert Locret(heads="x").stabilizers(4096) == 1024 and Locret(heads="x").stabilizers(40000) == 2500


def test_unscored_cells_are_refused_not_ranked():
    """Without its heads' scores Locret has nothing to rank by: it says so instead of keeping some cells."""
    L, H, n, budget = 2, 1, 12, 8
    positions = np.broadcast_to(np.arange(n), (L, H, n)).copy()
    view = PotView(n_layer=L, n_head_kv=H, n_cells=n, positions=positions, scores=None, logprobs=None,
                   chunk_positions=np.arange(n), tokens_seen=n, head_scores=None)
    with pytest.raises(KvpotError, match="without retaining-head scores"):
        Locret(heads="x", n_s=2).after_chunk(view)
    with pytest.raises(KvpotError, match="no scores for a pot"):
        Locret(heads="x", n_s=2).select(view, budget)
    with pytest.raises(KvpotError, match="do not fit the chunk"):
        Locret(heads="x", n_s=2).after_chunk(replace(view, head_scores=np.zeros((L, H, n - 1), np.float32)))
    scored = Locret(heads="x", n_s=2)
    scored.after_chunk(replace(view, head_scores=np.arange(L * H * n, dtype=np.float32).reshape(L, H, n)))
    assert scored.select(view, budget).shape == (L, H, budget)


@pytest.fixture(scope="module")
def smol_heads(smollm2_path, tmp_path_factory):
    """Random retaining heads for SmolLM2 in the published checkpoint layout, converted to an adapter."""
    base = BaseIdentity.of_model(smollm2_path)
    rng = np.random.default_rng(7)
    w = base.qkv_width()
    weights = {}
    for il in range(base.n_layer):
        weights[f"model.layers.{il}.self_attn.fc1.weight"] = rng.standard_normal((16, w), dtype=np.float32) / np.sqrt(w)
        weights[f"model.layers.{il}.self_attn.fc2.weight"] = rng.standard_normal((base.n_head_kv, 16), dtype=np.float32)
    d = tmp_path_factory.mktemp("locret")
    write_checkpoint(d / "heads.bin", weights)
    convert_locret(d / "heads.bin", smollm2_path, d / "heads.gguf")
    return d / "heads.gguf"


class RecordingLocret(Locret):
    """Locret that remembers what it saw and chose, to check against the reference."""

    def select(self, view, budget):
        before = (view.positions.copy(), self._score.copy())
        keep = super().select(view, budget)
        if keep is not None:
            self.log.append((before, keep, budget))
        return keep


def test_locret_on_the_pot_keeps_what_its_heads_rank_highest(smollm2_path, smol_heads):
    pol = RecordingLocret(heads=str(smol_heads), n_s=16, n_loc=32)
    pol.log = []
    budget, chunk = 96, 32
    doc, _, _ = logbook(n_entries=10, seed=2)
    with Engine(str(smollm2_path), pol, EngineConfig(budget=budget, chunk=chunk, n_threads=2)) as eng:
        eng.feed_text(doc, on_chunk=lambda ev: None)
        assert eng.n_cells <= budget + chunk
        assert eng.n_compactions >= 3
    assert len(pol.log) == eng.n_compactions
    for (positions, score), keep, b in pol.log:
        np.testing.assert_array_equal(keep, reference_keep(positions, score, b, pol.n_s))
        # the heads gave real, per-head scores for every token read
        assert np.isfinite(score).all() and np.ptp(score) > 0
        assert not np.array_equal(score[:, 0], score[:, 1])


def test_ask_with_locret_and_foreign_heads(smollm2_path, gemma_path, smol_heads, tmp_path):
    doc = tmp_path / "log.txt"
    doc.write_text(logbook(n_entries=8, seed=4)[0])
    res = run_cli("ask", str(doc), "Which day?", "-m", str(gemma_path), "--policy", f"locret:heads={smol_heads}",
                  "--budget", "256", "--chunk", "64", "-n", "4")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "was made for another model")
    # with the budget planned (auto), the refusal comes before the plan is said: still one line
    res = run_cli("ask", str(doc), "Which day?", "-m", str(gemma_path), "--policy", f"locret:heads={smol_heads}")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "was made for another model")
    res = run_cli("ask", str(doc), "Which day?", "-m", str(smollm2_path), "--policy", f"locret:heads={smol_heads}",
                  "--budget", "256", "--chunk", "64", "-n", "4")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("which", ["smollm2", "gemma", "qwen05"])
def test_shipped_heads_are_found_for_the_known_models(which, request, tmp_path):
    """`--policy locret` without a path takes the heads shipped in models/ for a known model, found by
    the model file's sha256; a model with none shipped (another file) still gets the one-line error."""
    from kvpot.models.registry import GEMMA3_270M, QWEN25_CODER_05B, SHIPPED_DIR, SMOLLM2_135M, shipped_adapter_for

    known = {"smollm2": SMOLLM2_135M, "gemma": GEMMA3_270M, "qwen05": QWEN25_CODER_05B}[which]
    path = request.getfixturevalue(f"{which}_path")
    shipped = SHIPPED_DIR / known.adapters["locret"]
    assert shipped.is_file() and shipped.stat().st_size < 4 << 20  # a few MB at most
    # found by the model file's hash, as the engine and the checks hand it to the policy
    assert shipped_adapter_for(Locret.adapter_kind, path) == shipped
    heads = Locret().retaining_heads(path, shipped_adapter_for(Locret.adapter_kind, path))
    assert heads.base == BaseIdentity.of_model(path)
    twin = unknown_twin(path, tmp_path)
    assert shipped_adapter_for(Locret.adapter_kind, twin) is None
    with pytest.raises(KvpotError, match="locret needs retaining heads for this model"):
        Locret().retaining_heads(twin, shipped_adapter_for(Locret.adapter_kind, twin))
    doc = tmp_path / "log.txt"
    doc.write_text(logbook(n_entries=8, seed=4)[0])
    res = run_cli("ask", str(doc), "Which day?", "-m", str(path), "--policy", "locret",
                  "--budget", "256", "--chunk", "64", "-n", "4")
    assert res.returncode == 0, res.stderr
