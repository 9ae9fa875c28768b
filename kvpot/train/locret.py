"""`kvpot train locret`: samples -> features and labels from llama.cpp -> torch fit -> adapter GGUF.

Every sample is captured once, before training (the backbone is frozen, so its features and labels
never change); the fit then makes several passes over them. Held-out samples (another seed stream
of the same generator) measure how well the trained heads rank cells: the Spearman correlation of
predicted scores with the labels, per (layer, KV head), averaged.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.converters.adapter import BaseIdentity, RetainingHeads, check_adapter_output, write_retaining_heads
from kvpot.errors import KvpotError
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot
from kvpot.safe_write import atomic_write
from kvpot.train.documents import Sample, default_sources, make_samples
from kvpot.train.locret_capture import Captured, Capturer
from kvpot.train.locret_fit import FitConfig, evaluate, fit, import_torch, to_heads

N_BATCH = 512


@dataclass
class TrainReport:
    heads: RetainingHeads
    losses: list[float]
    loss_before: float = 0.0     # mean loss on the training samples at initialisation
    loss_after: float = 0.0      # the same after training
    spearman: float | None = None  # on held-out samples
    n_tokens: int = 0            # labelled prompt tokens captured
    sources: list[Path] = field(default_factory=list)


def spearman(pred: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation of two [n_tokens] vectors (no ties expected in float scores)."""
    rp = np.argsort(np.argsort(pred)).astype(np.float64)
    ry = np.argsort(np.argsort(y)).astype(np.float64)
    rp -= rp.mean()
    ry -= ry.mean()
    den = np.sqrt((rp ** 2).sum() * (ry ** 2).sum())
    return float((rp * ry).sum() / den) if den > 0 else 0.0


def heldout_spearman(model, data: list[Captured]) -> float:
    torch = model.torch
    vals = []
    with torch.no_grad():
        for s in data:
            pred = model(torch.from_numpy(s.x.astype(np.float32))).numpy()
            for l in range(pred.shape[0]):
                for h in range(pred.shape[2]):
                    vals.append(spearman(pred[l, :, h], s.y[l, :, h]))
    return float(np.mean(vals))


def _cache_file(cache: Path, base: BaseIdentity, s: Sample) -> Path:
    """Named by what determines the capture: the model file and the sample's tokens and split."""
    h = hashlib.sha256(f"{base.sha256}|{s.n_prompt}|{s.kind}|".encode())
    h.update(np.asarray(s.tokens, dtype=np.int64).tobytes())
    return cache / f"locret-{h.hexdigest()[:32]}.npz"


def prepare_cache(cache: Path | str | None) -> Path | None:
    """The capture cache folder, made if missing and checked usable before any sample is read."""
    if cache is None:
        return None
    cache = Path(cache).expanduser()
    if cache.exists() and not cache.is_dir():
        raise KvpotError(f"--cache {cache}: it exists and is not a folder")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KvpotError(f"--cache {cache}: cannot make the folder ({e.strerror})") from None
    if not os.access(cache, os.R_OK | os.W_OK | os.X_OK):
        raise KvpotError(f"--cache {cache}: the folder is not readable and writable")
    return cache


def _load_cached(f: Path, sample: Sample, base: BaseIdentity, n_layers: int) -> Captured | None:
    """A cached capture, or None when it is missing or not what this sample's capture would be
    (damaged, or written by another kvpot): it is then captured again and rewritten."""
    try:
        with np.load(f, allow_pickle=False) as z:
            x, y = z["x"], z["y"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if (x.shape != (n_layers, sample.n_prompt, base.qkv_width()) or y.shape != (n_layers, sample.n_prompt, base.n_head_kv)
            or x.dtype != np.float16 or y.dtype != np.float32):
        return None
    return Captured(x=x, y=y, kind=sample.kind)


def _save_cached(f: Path, cap: Captured) -> None:
    with atomic_write(f, "captured sample") as out:
        np.savez(out, x=cap.x, y=cap.y)


def capture_all(model_path: Path, samples: list[Sample], base: BaseIdentity, threads: int,
                on_sample=None, cache: Path | None = None) -> tuple[list[Captured], list[int]]:
    """Decode each sample once with capture on; returns the captured data and the pot's layer ids.
    With a cache directory, captures are kept there and a later run (resumed, or another hidden
    size) reads them instead of decoding again."""
    cache = prepare_cache(cache)  # made and checked here too: callers other than train_locret reach this
    n_ctx = max(256, -(-max(len(s.tokens) for s in samples) // 256) * 256)
    model = LlamaModel(str(model_path))
    ctx = LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=N_BATCH, n_threads=threads))
    try:
        pot = Pot(ctx)
        cap = Capturer(ctx, pot, base, N_BATCH)
        out = []
        for i, s in enumerate(samples):
            f = _cache_file(cache, base, s) if cache else None
            cached = _load_cached(f, s, base, pot.n_layers) if f is not None and f.is_file() else None
            if cached is not None:
                out.append(cached)
            else:
                out.append(cap.run(s))
                if f is not None:
                    _save_cached(f, out[-1])
            if on_sample:
                on_sample(i, s)
        return out, list(pot.layer_ids)
    finally:
        ctx.close()
        model.close()


def train_locret(model_path: Path, out: Path, *, sources: list[Path] | None = None, n_samples: int = 48,
                 length: int = 768, n_heldout: int = 4, cfg: FitConfig | None = None, dtype: str = "f16",
                 on_capture=None, on_step=None, cache: Path | None = None) -> TrainReport:
    """Train retaining heads for the model at model_path and write them to out (an adapter GGUF)."""
    # before minutes of capture: where the results go, and a missing extra, are one line now
    check_adapter_output(out, inputs=(model_path,))
    cache = prepare_cache(cache)
    import_torch()
    cfg = cfg or FitConfig()
    sources = sources or default_sources()
    base = BaseIdentity.of_model(model_path)
    vocab = LlamaModel(str(model_path), vocab_only=True)
    try:
        samples = make_samples(vocab, sources, n_samples, length, cfg.seed)
        held = make_samples(vocab, sources, n_heldout, length, cfg.seed + 1_000_003) if n_heldout else []
    finally:
        vocab.close()
    data, layer_ids = capture_all(model_path, samples + held, base, cfg.threads, on_capture, cache)
    train, test = data[:len(samples)], data[len(samples):]

    model, losses = fit(train, base, layer_ids, cfg, on_step)
    report = TrainReport(heads=to_heads(model, base, layer_ids), losses=losses,
                         loss_after=evaluate(model, train, cfg.alpha),
                         n_tokens=sum(s.x.shape[1] for s in train), sources=list(sources))
    torch = model.torch
    init = type(model)(torch, len(layer_ids), base.qkv_width(), cfg.hidden, base.n_head_kv, model.activation, cfg.seed)
    report.loss_before = evaluate(init, train, cfg.alpha)
    if test:
        report.spearman = heldout_spearman(model, test)
    write_retaining_heads(out, report.heads, dtype=dtype,
                          source=f"kvpot train locret: {n_samples} samples of {length} tokens, "
                                 f"{cfg.steps} steps, hidden {cfg.hidden}, seed {cfg.seed}")
    return report
