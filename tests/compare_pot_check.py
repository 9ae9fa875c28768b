"""Compare two pot_check outputs of one model: A from this machine, B from another CPU (aarch64 under
qemu) run with A's output as its reference (so B also prints `imposed`: its logits after compacting
with A's kept cells).

1. Kept cells chosen independently: every (layer, KV head) row keeps the same cells, except cells whose
   tapped score is within twice the measured A-vs-B tap difference of the row's cut-off (a near-tie
   that summation order alone can flip). The tap difference is measured in the same run, over the
   cells both kept.
2. Compaction on identical cells: B's `imposed` logits may differ from A's logits by no more than twice
   what stock llama.cpp's logits (no compaction; after the document and after the question) differ
   between A and B, or LOGIT_TOL of their range, whichever is larger; and the most likely next token is
   the same.
3. InfiniPot's NuC log-probs, computed in the graph, equal log_softmax of the same rows' full logits on
   each machine (NUC_TOL), and differ between A and B as much as that log_softmax does (within
   2 NUC_TOL): NuC adds no difference of its own.
4. Locret's retaining-head scores from the graph equal the same weights applied by pot_check to the
   captured heads input, on each machine (HEADS_TOL of their range).
5. EdgeInfinite's memory after a fold equals the sums over the cache's K and V on each machine
   (SAME_RUN_TOL); the logits read with that memory mixed in differ between A and B no more than the
   logits in 2 do, and differ from the ungated logits over the same cells by more than that (the memory
   is live). Only where both runs printed them (an f16 K and V cache).
6. InfLLM's in-graph lookup fetches, in every layer, the blocks the host ranks highest for the query the
   same graph captured (a different block only at a near-tie: within HEADS_TOL of the scores' range of
   the last one taken), on each machine; A and B fetch the same blocks except at near-ties (within twice
   the A-vs-B score difference), and where they fetch the same, the logits after the question differ no
   more than the logits in 2 do, or no more than the logits with the host-inserted cells (below) differ
   between A and B (the attention over those cells, not the lookup); on each machine, the fetched cells read back from the cache equal the
   stored blocks, back at RoPE 0 and as held at the lookup's angle against pot_check's own rotation
   (FETCH_TOL of their range: the fetch, its RoPE and its copy, apart from the attention),
   and the logits after the question equal those with the same blocks' cells put in by the host
   (kvpot_pot_insert; SAME_RUN_TOL of their range: the attention reads the fetched cells).
   Only where both runs printed them (an f16 K and V cache).
Prints a summary; exits 1 on a mismatch.

usage: python compare_pot_check.py A.txt B.txt
"""

from __future__ import annotations

import sys

import numpy as np

LOGIT_TOL = 0.02
# in-graph log-probs against log_softmax of the same run's logits: the same head on the same rows, so
# only the order of the soft-max sums differs
NUC_TOL = 1e-3
# a graph's F32 products against the same products in double on the host, relative to the values' range
SAME_RUN_TOL = 1e-3
# the retaining heads' F32 x F32 products: ggml-cuda runs them on tensor cores as TF32 (10-bit mantissa,
# unit roundoff 2**-11 = 4.9e-4 per input), so 8 roundoffs; CPUs keep F32 (1e-6 of the range here)
HEADS_TOL = 8 * 2.0**-11
# InfLLM's fetched cells read back against the blocks stored: K is rounded to f16 in the store and again in
# the cache at the lookup's angle (2**-11 each), and RoPE'd there and back in F32; V only passes f16 to f16
FETCH_TOL = 4 * 2.0**-11


def parse(path: str) -> dict:
    out: dict = {"kept": {}, "score": {}}
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] in ("kept", "score"):
            key = (int(f[1]), int(f[2]))
            out[f[0]][key] = [float(x) for x in f[3:]] if f[0] == "score" else [int(x) for x in f[3:]]
        elif f[0] in ("logits", "stock", "stock_q", "imposed", "nuc", "nuc_ref", "heads", "heads_ref", "memory", "memory_ref",
                      "gated", "ungated", "lookup_scores", "fetched", "fetched_ref", "fetched_at", "fetched_at_ref", "recalled", "recalled_ref"):
            out[f[0]] = np.array([float(x) for x in f[1:]])
            if f[0] == "logits":  # every 97th id, then the top-10 values: keep the sampled part
                out[f[0]] = out[f[0]][:-10]
        elif f[0] in ("lookup", "lookup_ref"):
            out[f[0]] = [int(float(x)) for x in f[1:]]
        elif f[0] == "top":
            out["top"] = [int(x) for x in f[1:]]
        elif f[0] == "model":
            out["model"] = " ".join(f[2:])
        elif f[0] == "after":
            out["after"] = line.strip()
    return out


def _by_layer(run: dict) -> tuple[list[set[int]], list[set[int]], np.ndarray]:
    k = 2  # pot_check's N_FETCH
    got, ref = run["lookup"], run["lookup_ref"]
    n_layer = len(got) // k
    scores = run["lookup_scores"].reshape(n_layer, -1)
    return ([set(got[i * k:(i + 1) * k]) for i in range(n_layer)], [set(ref[i * k:(i + 1) * k]) for i in range(n_layer)],
            scores)


def _near_tie(blocks: set[int], scores: np.ndarray, taken: set[int], tol: float) -> bool:
    """Every block in `blocks` scores within tol of the lowest-scoring block of `taken`."""
    cut = min(scores[b] for b in taken)
    return all(abs(scores[b] - cut) <= tol for b in blocks)


def compare_lookup(a: dict, b: dict, a_path: str, b_path: str, bound: float, problems: list[str]) -> str:
    for name, run in ((a_path, a), (b_path, b)):
        if not all(k in run for k in ("lookup", "lookup_ref", "lookup_scores", "recalled", "recalled_ref")):
            problems.append(f"{name} has no lookup/lookup_ref/lookup_scores/recalled/recalled_ref lines")
            return "InfLLM lookup missing"
    # on each machine: the logits after the in-graph fetch equal those after the host put the same
    # blocks' cells in (the same cells, the same attention; only the path that wrote them differs)
    by_host = 0.0
    for name, run in ((a_path, a), (b_path, b)):
        span = float(np.ptp(run["recalled_ref"]))
        err = float(np.abs(run["recalled"] - run["recalled_ref"]).max())
        by_host = max(by_host, err / max(span, 1e-30))
        if err > SAME_RUN_TOL * span:
            problems.append(f"{name}: logits after the in-graph fetch differ from the host-inserted cells' by {err:.4g}")
    same_run_ties = 0
    fetch_err = 0.0
    for name, run in ((a_path, a), (b_path, b)):
        for tag, what in (("fetched", "the stored blocks"), ("fetched_at", "the stored keys rotated here")):
            if tag not in run or run[tag].shape != run.get(tag + "_ref", np.empty(0)).shape:
                problems.append(f"{name} has no {tag}/{tag}_ref lines of one length")
                continue
            ref = run[tag + "_ref"]
            err = float(np.abs(run[tag] - ref).max() / max(float(np.ptp(ref)), 1e-30))
            fetch_err = max(fetch_err, err)
            if err > FETCH_TOL:
                problems.append(f"{name}: the fetched cells ({tag}) differ from {what} by {err:.3g} of their range")
        got, ref, scores = _by_layer(run)
        for layer, (g, r) in enumerate(zip(got, ref)):
            if g == r:
                continue
            tol = HEADS_TOL * float(np.ptp(scores[layer]))
            if _near_tie(g ^ r, scores[layer], r, tol):
                same_run_ties += 1
            else:
                problems.append(f"{name}: layer {layer} fetched blocks {sorted(g)} in the graph, the host ranks {sorted(r)}")
    ga, _, sa = _by_layer(a)
    gb, _, sb = _by_layer(b)
    noise = float(np.abs(sa - sb).max())
    differ = [layer for layer in range(len(ga)) if ga[layer] != gb[layer]]
    for layer in differ:
        if not _near_tie(ga[layer] ^ gb[layer], sa[layer], ga[layer], 2 * noise):
            problems.append(f"layer {layer} fetches {sorted(ga[layer])} on one machine, {sorted(gb[layer])} on the other")
    text = (f"InfLLM lookup: graph = host ranking in {2 * len(ga) - same_run_ties}/{2 * len(ga)} layer runs "
            f"(others near-ties), {len(ga) - len(differ)}/{len(ga)} layers fetch the same blocks on both, "
            f"fetched cells vs stored blocks, at RoPE 0 and at the lookup's angle, {fetch_err:.2g} of range (bound {FETCH_TOL:.2g}), logits vs the "
            f"host-inserted cells' {by_host:.2g} of range (bound {SAME_RUN_TOL:.2g})")
    if not differ:
        recalled = float(np.abs(a["recalled"] - b["recalled"]).max())
        by_host_ab = float(np.abs(a["recalled_ref"] - b["recalled_ref"]).max())
        text += f", logits after them {recalled:.3g} (bound {bound:.3g}; with the host-inserted cells {by_host_ab:.3g})"
        # past stock's calibration, the lookup is still cleared where the same cells put in by the host
        # differ between the machines as much: then the difference is the attention over those cells
        # (llama.cpp's), the lookup having been checked exact on each machine above
        span = float(np.ptp(a["recalled_ref"]))
        if recalled > bound and abs(recalled - by_host_ab) > SAME_RUN_TOL * span:
            problems.append(f"logits after the InfLLM lookup differ by {recalled:.4g} > {bound:.4g}, "
                            f"with the host-inserted cells by {by_host_ab:.4g}")
    return text


def main(a_path: str, b_path: str) -> int:
    a, b = parse(a_path), parse(b_path)
    problems = []
    if a.get("model") != b.get("model") or a.get("after") != b.get("after"):
        problems.append(f"shapes differ: {a.get('model')} / {b.get('model')}; {a.get('after')} / {b.get('after')}")
    if "imposed" not in b:
        problems.append(f"{b_path} has no `imposed` line (run it with {a_path} as REF)")

    # tap noise between the two CPUs: score differences over the cells both runs kept
    noise = 0.0
    for key, ka in a["kept"].items():
        kb = b["kept"].get(key, [])
        sa = dict(zip(ka, a["score"][key]))
        sb = dict(zip(kb, b["score"].get(key, [])))
        for c in set(ka) & set(kb):
            noise = max(noise, abs(sa[c] - sb[c]))
    n_same = n_tie = 0
    for key, ka in a["kept"].items():
        kb = b["kept"].get(key)
        if kb is None:
            problems.append(f"layer {key[0]} head {key[1]} missing in {b_path}")
            continue
        if ka == kb:
            n_same += 1
            continue
        sa, sb = dict(zip(ka, a["score"][key])), dict(zip(kb, b["score"][key]))
        cut_a, cut_b = a["score"][key][-1], b["score"][key][-1]
        far = [c for c in set(ka) - set(kb) if sa[c] - cut_a > 2 * noise] + \
              [c for c in set(kb) - set(ka) if sb[c] - cut_b > 2 * noise]
        if far:
            problems.append(f"layer {key[0]} head {key[1]} keeps different cells beyond a tie: {sorted(far)[:8]}")
        else:
            n_tie += 1
    rows = len(a["kept"])

    # stock llama.cpp's own A-vs-B difference, after the document and after the question (the row every
    # logits check below reads), whichever is larger
    stock_diff = max(float(np.abs(a[k] - b[k]).max()) for k in ("stock", "stock_q") if k in a and k in b)
    span = float(a["logits"].max() - a["logits"].min())
    line = (f"{rows} (layer, head) rows: {n_same} identical, {n_tie} differ only at near-ties "
            f"(tap noise {noise:.3g}), {rows - n_same - n_tie} differ; stock logits max |diff| {stock_diff:.3g}")
    if "imposed" in b:
        pot_diff = float(np.abs(a["logits"] - b["imposed"]).max())
        bound = max(2 * stock_diff, LOGIT_TOL * span)
        line += f"; after compaction on identical cells {pot_diff:.3g} (bound {bound:.3g}, range {span:.3g})"
        if pot_diff > bound:
            problems.append(f"logits after compaction differ by {pot_diff:.4g} > {bound:.4g}")
        idx_a = int(np.argmax(a["logits"]))
        if idx_a != int(np.argmax(b["imposed"])):
            problems.append("the most likely sampled token differs after compaction")
    # NuC's in-graph log-probs: equal to log_softmax of full logits on each machine, and across the two
    # no further apart than stock logits are
    nuc_self = 0.0
    for name, run in ((a_path, a), (b_path, b)):
        if "nuc" not in run or "nuc_ref" not in run:
            problems.append(f"{name} has no nuc/nuc_ref lines")
            continue
        err = float(np.abs(run["nuc"] - run["nuc_ref"]).max())
        nuc_self = max(nuc_self, err)
        if err > NUC_TOL:
            problems.append(f"{name}: in-graph log-probs differ from log_softmax of the logits by {err:.4g} > {NUC_TOL}")
    if "nuc" in a and "nuc" in b:
        nuc_diff = float(np.abs(a["nuc"] - b["nuc"]).max())
        line += f"; NuC log-probs vs log_softmax {nuc_self:.3g} (bound {NUC_TOL}), {nuc_diff:.3g} between the two"
        # the same rows' log_softmax of stock llama.cpp's logits differ by as much between A and B: NuC
        # adds no difference of its own
        ref_diff = float(np.abs(a["nuc_ref"] - b["nuc_ref"]).max())
        line += f" (stock's log_softmax {ref_diff:.3g})"
        if abs(nuc_diff - ref_diff) > 2 * NUC_TOL:
            problems.append(f"NuC log-probs differ between the two by {nuc_diff:.4g}, stock's log_softmax by {ref_diff:.4g}")
    bound = max(2 * stock_diff, LOGIT_TOL * span)
    for tag, what, tol in (("heads", "retaining-head scores", HEADS_TOL), ("memory", "gated memory M, z", SAME_RUN_TOL)):
        if tag not in a and tag == "memory" and "memory" not in b:
            continue  # a quantized K cache: no gated memory
        worst = 0.0
        for name, run in ((a_path, a), (b_path, b)):
            if tag not in run or tag + "_ref" not in run or run[tag].shape != run[tag + "_ref"].shape:
                problems.append(f"{name} has no {tag}/{tag}_ref lines of one length")
                continue
            ref = run[tag + "_ref"]
            err = float(np.abs(run[tag] - ref).max() / max(float(np.abs(ref).max()), 1e-30))
            worst = max(worst, err)
            if err > tol:
                problems.append(f"{name}: {what} from the graph differ from the host's by {err:.3g} of their range")
        line += f"; {what} vs host {worst:.2g} of range (bound {tol:.2g})"
    if "gated" in a or "gated" in b:
        if not all(k in run for run in (a, b) for k in ("gated", "ungated")):
            problems.append("gated/ungated lines in only one run")
        else:
            gated_diff = float(np.abs(a["gated"] - b["gated"]).max())
            effect = min(float(np.abs(r["gated"] - r["ungated"]).max()) for r in (a, b))
            line += f"; with the gated memory {gated_diff:.3g} (bound {bound:.3g}; the memory moves logits by {effect:.3g})"
            if gated_diff > bound:
                problems.append(f"logits with the gated memory differ by {gated_diff:.4g} > {bound:.4g}")
            if effect <= bound:
                problems.append(f"the gated memory moves the logits by only {effect:.3g}: the check would not see it")
    if "lookup" in a or "lookup" in b:
        line += "; " + compare_lookup(a, b, a_path, b_path, bound, problems)
    independent = float(np.abs(a["logits"] - b["logits"]).max())
    line += f"; with each CPU's own cells {independent:.3g}; top-1 {a['top'][0]} vs {b['top'][0]}"
    print(line)
    for p in problems[:10]:
        print("MISMATCH:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
