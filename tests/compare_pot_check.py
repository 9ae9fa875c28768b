"""Compare two pot_check outputs (e.g. x86 native and aarch64 under qemu) of the same model.

Kept cells: every (layer, KV head) must keep the same cells, except where the two runs' tapped scores
tie within TIE (relative to the head's largest score) at the boundary, so that float summation order
alone may pick either cell. Logits: the sampled logits must agree within LOGIT_TOL of their range, and
the most likely next token must be the same. Prints a one-line summary; exits 1 on a mismatch.

usage: python compare_pot_check.py A.txt B.txt
"""

from __future__ import annotations

import sys

import numpy as np

TIE = 1e-3
LOGIT_TOL = 0.02


def parse(path: str) -> dict:
    out = {"kept": {}, "score": {}}
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] in ("kept", "score"):
            key = (int(f[1]), int(f[2]))
            out[f[0]][key] = [float(x) for x in f[3:]] if f[0] == "score" else [int(x) for x in f[3:]]
        elif f[0] == "logits":
            out["logits"] = np.array([float(x) for x in f[1:]])
        elif f[0] == "top":
            out["top"] = [int(x) for x in f[1:]]
        elif f[0] in ("model", "after"):
            out[f[0]] = " ".join(f[2:]) if f[0] == "model" else line.strip()
    return out


def main(a_path: str, b_path: str) -> int:
    a, b = parse(a_path), parse(b_path)
    problems = []
    if a.get("model") != b.get("model") or a.get("after") != b.get("after"):
        problems.append(f"shapes differ: {a.get('model')} / {b.get('model')}; {a.get('after')} / {b.get('after')}")
    n_diff = n_tie = 0
    for key, ka in a["kept"].items():
        kb = b["kept"].get(key)
        if kb is None:
            problems.append(f"layer {key[0]} head {key[1]} missing in {b_path}")
            continue
        if ka == kb:
            continue
        sa, sb = a["score"][key], b["score"][key]
        scale = max(max(sa), max(sb), 1e-30)
        cut = max(sa[-1], sb[-1])  # the first dropped cell's score: everything near it is a tie
        only = sorted(set(ka) ^ set(kb))
        score_of = {c: s for c, s in zip(ka, sa)} | {c: s for c, s in zip(kb, sb)}
        if all(abs(score_of[c] - cut) <= TIE * scale for c in only):
            n_tie += 1
        else:
            n_diff += 1
            problems.append(f"layer {key[0]} head {key[1]} keeps different cells: {only[:8]}")
    la, lb = a["logits"], b["logits"]
    n_sampled = len(la) - 10
    diff = float(np.abs(la[:n_sampled] - lb[:n_sampled]).max())
    span = float(la[:n_sampled].max() - la[:n_sampled].min())
    if diff > LOGIT_TOL * span:
        problems.append(f"logits differ by {diff:.4g} (range {span:.4g})")
    if a["top"][0] != b["top"][0]:
        problems.append(f"top token differs: {a['top'][0]} vs {b['top'][0]}")
    heads = len(a["kept"])
    print(f"{heads} (layer, head) rows: {heads - n_diff - n_tie} identical, {n_tie} differ only at a tie, "
          f"{n_diff} differ; logits max |diff| {diff:.3g} of range {span:.3g}; top-10 shared "
          f"{len(set(a['top']) & set(b['top']))}/10; top-1 {a['top'][0]} vs {b['top'][0]}")
    for p in problems[:10]:
        print("MISMATCH:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
