"""`kvpot train edgeinfinite`: train EdgeInfinite's memory-gating module on a frozen backbone.

The torch forward of the memory and gate here is the computation of kvpot.policies.edgeinfinite_memory and
MemoryGate.mix (the NumPy reference the in-graph layer is tested against), written in torch; tests/test_train_edgeinfinite.py
checks the two agree on the same inputs.

One training step (a decision: the paper gives data, epochs and learning rate, not the step):
  a window of L_sink + n_seg * L_seg tokens of a long document is read the way kvpot reads it with the
  EdgeInfinite policy: the sink first (positions 0..L_sink-1, no memory), then each segment at positions
  L_sink.. (positions are places in the cache, as with CR-RoPE), attending to the sink's cached K, V,
  to itself causally and to the memory of the segments before it; after each segment its K (RoPE'd) and
  V are folded into M, z. Segments before the last run without gradients (they only build the memory;
  M, z are detached), the last one with them, and its next-token loss is the step's loss. Only the gate
  learns (W1, b1, W2, b2, g per layer); the backbone is frozen.
Reading mode (L_chunk > 0): the step above trains a segment that sees only the sink, itself
  and the memory, while at inference a chunk also sees the cells not yet folded (the window and the
  leftover), so the memory matters less there than in training (the first shipped gate, trained this
  way, made perplexity worse than the untrained one). In reading mode all n_seg segments are folded,
  then an unfolded run of L_window + u tokens (u drawn per step in [0, L_seg - L_chunk]: the leftover
  between two folds) is read after the sink with the memory, and a chunk of L_chunk tokens after it is
  trained on: the trained tokens see what a chunk sees in `kvpot bench ppl` (sink + unfolded + itself + memory).
Data: long offline text, by default the Python standard library's source files (/usr/lib/python3.*),
  the longest first, with the document windows drawn by a seeded generator.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpot.converters.adapter import check_adapter_output, initial_memory_gate, write_memory_gate
from kvpot.errors import KvpotError
from kvpot.runtime.llama import LlamaModel
from kvpot.session.checks import check_threads
from kvpot.train.edgeinfinite_emulate import emulated_loss, engine_config
from kvpot.train.edgeinfinite_torch import GateModule, empty_memory, fold_all, load_torch, memory_mix
from kvpot.train.gguf_torch import Prefix, forward, load_weights

# -- data ---------------------------------------------------------------------------------------------------

def python_sources(min_bytes: int = 40_000) -> list[Path]:
    """The Python standard library's long source files on this machine, longest first (the same list on
    every machine with the same Python)."""
    files = []
    for root in sorted(Path("/usr/lib").glob("python3.*")):
        for f in root.rglob("*.py"):
            if "test" in f.parts or "site-packages" in f.parts or "dist-packages" in f.parts:
                continue
            try:
                size = f.stat().st_size
            except OSError:
                continue
            if size >= min_bytes:
                files.append((size, str(f)))
    files.sort(key=lambda x: (-x[0], x[1]))
    return [Path(f) for _, f in files]


def prose_sources(min_bytes: int = 10_000) -> list[Path]:
    """English prose on every Debian-based machine (package base-files): the licence texts under
    /usr/share/common-licenses, each once (its symlinks skipped), longest first. Legal prose, unlike the
    generated logbook the benchmarks read, so the prose benchmark stays held out."""
    root = Path("/usr/share/common-licenses")
    files = sorted(((f.stat().st_size, str(f)) for f in root.glob("*") if f.is_file() and not f.is_symlink()
                    and f.stat().st_size >= min_bytes), key=lambda x: (-x[0], x[1])) if root.is_dir() else []
    if not files:
        raise KvpotError(f"no prose to train on: {root} (Debian's base-files) holds no licence texts; use --data code")
    return [Path(f) for _, f in files]


def alternate(*sources: Iterator[list[int]]) -> Iterator[list[int]]:
    """One window from each source in turn (code, prose, code, ...): each kind half the steps, however
    many documents each has."""
    while True:
        for src in sources:
            yield next(src)


def windows(tokenize: Callable[[str], list[int]], files: list[Path], length: int, seed: int) -> Iterator[list[int]]:
    """Endless windows of `length` tokens from the documents, drawn by a seeded generator."""
    rng = random.Random(seed)
    docs = []
    for f in files:
        toks = tokenize(f.read_text(errors="replace"))
        if len(toks) >= length:
            docs.append(toks)
    if not docs:
        raise KvpotError(f"no training document holds {length} tokens")
    while True:
        doc = docs[rng.randrange(len(docs))]
        s = rng.randrange(len(doc) - length + 1)
        yield doc[s:s + length]


# -- one step ------------------------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    L_sink: int = 32
    L_seg: int = 128
    n_seg: int = 3
    L_window: int = 0  # reading mode only: cells never folded
    L_chunk: int = 0   # > 0: reading mode (the module docstring), the trained chunk's length
    steps: int = 150
    lr: float = 1e-3   # the paper's 5e-3 (3B model, 100K samples) moved SmolLM2's gate too far in 40 steps
    data: str = "code"  # code: Python stdlib sources; mixed: those and prose_sources() in turn
    lr_g: float = 0.0  # > 0: the gate logits g's own rate (Adam moves g by about lr a step: at 1e-3 the
                       # initial -4 barely moves in 40 steps, sigmoid(g) stays at 0.018); 0: lr
    budget: int = 0    # > 0: read as the engine does (kvpot.train.edgeinfinite_emulate), n_chunks chunks first
    n_chunks: int = 0
    mem_cells: int = 0  # the memory's size in cells (the policy's), counted against the budget once folded
    seed: int = 0
    threads: int = 2


def window_length(cfg: TrainConfig) -> int:
    """Tokens one step reads (reading mode: with the longest unfolded run)."""
    if cfg.budget:
        return (cfg.n_chunks + 1) * cfg.L_chunk
    if cfg.L_chunk:
        return cfg.L_sink + cfg.n_seg * cfg.L_seg + cfg.L_window + max(0, cfg.L_seg - cfg.L_chunk) + cfg.L_chunk
    return cfg.L_sink + cfg.n_seg * cfg.L_seg


def segment_loss(weights, gate: GateModule, tokens: list[int], cfg: TrainConfig, leftover: int = 0):
    """The step's loss: next-token cross-entropy of the last segment (reading mode: of the chunk after
    `leftover` + L_window unfolded tokens), read as kvpot reads it."""
    torch = load_torch()
    if cfg.budget:
        return emulated_loss(weights, gate, tokens, cfg)
    if cfg.L_chunk:
        return _chunk_loss(weights, gate, tokens, cfg, leftover)

    pre, text = _read_sink(weights, tokens[:cfg.L_sink]), cfg.L_sink
    mem = empty_memory(weights, gate)
    loss = None
    for s in range(cfg.n_seg):
        seg = tokens[text:text + cfg.L_seg]
        last = s == cfg.n_seg - 1
        ctx = torch.enable_grad() if last else torch.no_grad()
        with ctx:
            logits, kvs = forward(weights, seg, cfg.L_sink, prefix=pre, mix=memory_mix(gate, mem, s > 0),
                                  logits=last, text0=text)
        text += len(seg)
        if last:
            target = torch.as_tensor(seg[1:])
            loss = torch.nn.functional.cross_entropy(logits[:-1], target)
        else:
            kvs = [(k.detach(), v.detach()) for k, v in kvs]
            mem = fold_all(mem, kvs)
            pre = pre.after(weights, kvs, keep=False)
    return loss


def _read_sink(weights, sink: list[int]):
    """The prefix after the sink was read at positions 0.. without memory."""
    torch = load_torch()
    pre = Prefix.empty(weights)
    if not sink:
        return pre
    with torch.no_grad():
        _, kvs = forward(weights, sink, 0, logits=False)
    return pre.after(weights, kvs, keep=True)


def _chunk_loss(weights, gate: GateModule, tokens: list[int], cfg: TrainConfig, leftover: int):
    """Reading mode: sink, n_seg folded segments, an unfolded run, then the trained chunk. Pot layers see
    the chunk at its cache position (after the sink and the run); window layers the text just before."""
    torch = load_torch()
    pre, text = _read_sink(weights, tokens[:cfg.L_sink]), cfg.L_sink
    mem = empty_memory(weights, gate)
    with torch.no_grad():
        for s in range(cfg.n_seg):
            seg = tokens[text:text + cfg.L_seg]
            _, kvs = forward(weights, seg, cfg.L_sink, prefix=pre, mix=memory_mix(gate, mem, s > 0),
                             logits=False, text0=text)
            text += len(seg)
            mem = fold_all(mem, kvs)
            pre = pre.after(weights, kvs, keep=False)
        run = tokens[text:text + cfg.L_window + leftover]
        if run:
            _, kvs = forward(weights, run, cfg.L_sink, prefix=pre, mix=memory_mix(gate, mem, cfg.n_seg > 0),
                             logits=False, text0=text)
            text += len(run)
            pre = pre.after(weights, kvs, keep=True)
    chunk = tokens[text:text + cfg.L_chunk]
    logits, _ = forward(weights, chunk, cfg.L_sink + len(run), prefix=pre, mix=memory_mix(gate, mem, cfg.n_seg > 0),
                        text0=text)
    return torch.nn.functional.cross_entropy(logits[:-1], torch.as_tensor(chunk[1:]))


def train(model: Path, out: Path, cfg: TrainConfig, log: Callable[[str], None] = print,
          init_gate=None) -> dict:
    """Train a gate for `model`, write it to `out` (adapter GGUF); returns a summary."""
    check_adapter_output(out, inputs=(model,))  # before the work, not after it
    check_threads(cfg.threads)
    torch = load_torch()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    if cfg.budget:
        cfg = engine_config(model, cfg)
        log(f"read as the engine does at budget {cfg.budget}, chunk {cfg.L_chunk}: L_sink {cfg.L_sink}, "
            f"L_window {cfg.L_window}, L_seg {cfg.L_seg}, memory {cfg.mem_cells} cells, "
            f"{cfg.n_chunks} chunks before the trained one")
    weights = load_weights(model)
    for t in weights.tensors.values():
        t.requires_grad_(False)
    gate = GateModule(init_gate if init_gate is not None else initial_memory_gate(model))
    tok_model = LlamaModel(str(model), vocab_only=True)
    try:
        # a window starts as kvpot reads a text: with the BOS the model's tokenizer adds (Gemma-3 attends to
        # it as its sink; a window cut from the middle of a document without it is not what kvpot reads)
        bos = tok_model.bos()
        n = window_length(cfg) - len(bos)
        src = windows(tok_model.tokenize, python_sources(), n, cfg.seed)
        if cfg.data == "mixed":
            src = alternate(src, windows(tok_model.tokenize, prose_sources(), n, cfg.seed + 2))
        data = (bos + w for w in src)
        left = random.Random(cfg.seed + 1)  # the unfolded leftover of each reading-mode step
        p = gate.params
        opt = torch.optim.Adam([{"params": [p[n] for n in ("w1", "b1", "w2", "b2")]},
                                {"params": [p["g"]], "lr": cfg.lr_g or cfg.lr}], lr=cfg.lr)
        t0, losses = time.time(), []
        for step in range(cfg.steps):
            u = left.randint(0, max(0, cfg.L_seg - cfg.L_chunk)) if cfg.L_chunk else 0
            loss = segment_loss(weights, gate, next(data), cfg, leftover=u)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if step % 10 == 0 or step == cfg.steps - 1:
                recent = losses[-10:]
                log(f"step {step + 1}/{cfg.steps}  loss {sum(recent) / len(recent):.4f}  "
                    f"sigmoid(g) {float(torch.sigmoid(gate.params['g'].detach()).mean()):.3f}  {time.time() - t0:.0f}s")
    finally:
        tok_model.close()
    reading = f", reading mode: L_window {cfg.L_window}, L_chunk {cfg.L_chunk}" if cfg.L_chunk else ""
    if cfg.budget:
        reading = f", read as the engine does: budget {cfg.budget}, L_window {cfg.L_window}, chunk {cfg.L_chunk} x {cfg.n_chunks + 1}"
    segments = "" if cfg.budget else f", {cfg.n_seg} segments"
    source = (f"kvpot train edgeinfinite: {cfg.steps} steps, L_sink {cfg.L_sink}, L_seg {cfg.L_seg}"
              f"{segments}{reading}, lr {cfg.lr}{f', lr_g {cfg.lr_g}' if cfg.lr_g else ''}, seed {cfg.seed}, "
              f"{'Python stdlib sources and base-files licences in turn' if cfg.data == 'mixed' else 'Python stdlib sources'}")
    write_memory_gate(out, gate.to_gate(), source=source)
    return {"steps": cfg.steps, "config": cfg, "first_loss": losses[0] if losses else math.nan,
            "last_loss": float(np.mean(losses[-10:])) if losses else math.nan}
