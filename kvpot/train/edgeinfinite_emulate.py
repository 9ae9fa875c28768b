"""EdgeInfinite training step that reads a window exactly as kvpot's engine reads a text.

Why: the reading-mode step of kvpot.train.edgeinfinite reads every folded segment at the positions right
after the sink, so the keys it folds carry RoPE angles L_sink .. L_sink + L_seg, and the trained chunk sees
one fixed geometry. kvpot folds the oldest unfolded cells, which sit anywhere up to L_sink + L_window +
L_seg when they are folded (CR-RoPE packs the cache), and the first fold takes everything read past the
sink and window at once. A gate trained on the narrow band of angles read Gemma-3's code worse than the
untrained gate (docs/edgeinfinite.md). Here the step follows the engine and the policy (fit, _due, the
limit of budget less the memory once it exists): chunks of L_chunk tokens are read at the cache's next
position, attending to every cell kept, itself and the memory; after a chunk, when the cells exceed the
limit, the cells after the sink are folded in whole segments up to the window and the kept ones are
re-rotated to packed positions (CR-RoPE); window layers attend by text position (gguf_torch). The last
chunk is trained on, the ones before run without gradients.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvpot.policies import EdgeInfinite
from kvpot.train.edgeinfinite_torch import empty_memory, fold_all, memory_mix
from kvpot.train.gguf_torch import Prefix, forward, rope


def engine_config(model: Path, cfg):
    """cfg with the lengths and memory size EdgeInfinite's policy reads with at cfg.budget and
    cfg.L_chunk (its fit, the memory of the model's gate counted), and n_chunks (0: enough chunks
    before the trained one that it reads after at least two folds)."""
    policy = EdgeInfinite(gate="init")
    policy.memory_gate(model)  # sizes the memory in cells (the same for every gate of this model)
    policy.fit(cfg.budget, cfg.L_chunk)
    sink, window, seg = policy.lengths()
    n_chunks = cfg.n_chunks or -(-(2 * cfg.budget) // cfg.L_chunk)
    return dataclasses.replace(cfg, L_sink=sink, L_window=window, L_seg=seg, n_seg=0, n_chunks=n_chunks,
                               mem_cells=policy.memory_cells)


def emulated_loss(weights, gate, tokens: list[int], cfg):
    """Next-token loss of the last of cfg.n_chunks + 1 chunks, read as `kvpot bench ppl` reads them."""
    import torch


    w = weights
    C = cfg.L_chunk
    chunks = [tokens[i * C:(i + 1) * C] for i in range(cfg.n_chunks + 1)]
    pre, mem, has_mem, n_cells, text = Prefix.empty(w), empty_memory(w, gate), False, 0, 0
    for i, chunk in enumerate(chunks):
        last = i == cfg.n_chunks
        with torch.enable_grad() if last else torch.no_grad():
            logits, kvs = forward(w, chunk, n_cells, prefix=pre, mix=memory_mix(gate, mem, has_mem),
                                  logits=last, text0=text)
        if last:
            return torch.nn.functional.cross_entropy(logits[:-1], torch.as_tensor(chunk[1:]))
        pre = pre.after(w, kvs, keep=True)
        n_cells, text = n_cells + len(chunk), text + len(chunk)
        limit = cfg.budget - (cfg.mem_cells if has_mem else 0)
        if n_cells <= limit:
            continue
        # EdgeInfinite._due: whole segments of what lies between the sink and the window
        n_fold = max(0, (n_cells - cfg.L_sink - cfg.L_window) // cfg.L_seg) * cfg.L_seg
        s, e = cfg.L_sink, cfg.L_sink + n_fold
        mem = fold_all(mem, [None if x is None else (x[0][s:e], x[1][s:e]) for x in pre.pot])
        shift = torch.full((n_cells - e,), -n_fold)
        pre.pot = [None if x is None else
                   (torch.cat([x[0][:s], rope(x[0][e:], shift, w.rope_base[il], w.neox)]), torch.cat([x[1][:s], x[1][e:]]))
                   for il, x in enumerate(pre.pot)]
        n_cells -= n_fold
        has_mem = True
    raise AssertionError("unreachable: the last chunk returns")
