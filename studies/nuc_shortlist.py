"""Whether NuC could run the output head on part of the vocabulary: each token's log p computed with the
soft-max's normalizer summed over the first N vocabulary ids only (and the token itself), which would cost
N / n_vocab of the head, against the exact log p NuC uses, on a real text read by stock llama.cpp with
every row's logits.

What NuC does with the log-probs is rank the cells of a full pot and take the T least expected (InfiniPot
appendix B: T = nuc_ratio * |C|, |C| = |M| / 2); so the figure that decides is how many of those T a
shortlist would still take, in every pot-sized window of the text, beside how far the log-probs move.

    python -m studies.nuc_shortlist -m gemma3-270m --text manual --json docs/bench/nuc/shortlist-gemma3.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kvpot.bench.texts import SMALL_FILE, manual_text, stdlib_code
from kvpot.errors import KvpotError
from kvpot.models.resolve import resolve_model
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.safe_write import write_text_file

TEXTS = {"code": lambda: stdlib_code(40, SMALL_FILE), "manual": manual_text}
SHORTLISTS = (8192, 16384, 32768, 65536)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.nuc_shortlist", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", action="append", default=None, help="known model names (repeatable)")
    p.add_argument("--text", choices=sorted(TEXTS), action="append", default=None,
                   help="code: Python's library sources; manual: the GNU diffutils manual (repeatable)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens of the text read")
    p.add_argument("--budget", type=int, default=2048, help="|M|, the pot's cells: the window NuC ranks")
    p.add_argument("--nuc-ratio", type=float, default=0.5, help="InfiniPot's nuc_ratio: T = nuc_ratio * |M| / 2")
    p.add_argument("--shortlist", type=int, action="append", default=None,
                   help=f"N, vocabulary ids summed (repeatable; default {', '.join(map(str, SHORTLISTS))})")
    p.add_argument("--chunk", type=int, default=512, help="rows decoded at a time")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


def shortlist_logprob(logits: np.ndarray, targets: np.ndarray, n: int) -> np.ndarray:
    """log p of each row's target with the normalizer over ids [0, n) and the target: [rows, V] -> [rows]."""
    z = np.asarray(logits, dtype=np.float64)  # no copy when the caller converted once for every N
    rows = np.arange(len(targets))
    zt = z[rows, targets]
    head = z[:, :n]
    m = np.maximum(head.max(axis=1), zt)
    s = np.exp(head - m[:, None]).sum(axis=1) + np.where(targets >= n, np.exp(zt - m), 0.0)
    return zt - (m + np.log(s))


def lowest(logp: np.ndarray, window: int, t: int) -> list[set[int]]:
    """The t least expected positions of each window-sized stretch (one per half window)."""
    step = max(window // 2, 1)
    return [set((w0 + np.argsort(logp[w0:w0 + window], kind="stable")[:t]).tolist())
            for w0 in range(0, len(logp) - window + 1, step)]


def measure(name: str, text: str, tokens: int, budget: int, nuc_ratio: float, shortlists: list[int],
            chunk: int, threads: int) -> dict:
    facts, _ = resolve_model(name)
    model = LlamaModel(str(facts.path))
    try:
        toks = np.array((model.bos() + model.tokenize(TEXTS[text]()))[:tokens + 1])
        if len(toks) < tokens + 1:
            raise SystemExit(f"the {text} text gave {len(toks)} tokens, fewer than {tokens + 1}")
        V = model.n_vocab
        ns = sorted({min(n, V) for n in shortlists})
        ctx = LlamaContext(model, ContextParams(n_ctx=tokens + chunk, n_batch=chunk, n_threads=threads))
        exact, approx = [], {n: [] for n in ns}
        try:
            for p0 in range(0, tokens, chunk):
                n_rows = min(chunk, tokens - p0)
                ctx.decode(toks[p0:p0 + n_rows].tolist(), p0, logits="all")
                z = np.stack([ctx.logits_row(i) for i in range(n_rows)]).astype(np.float64)
                tgt = toks[p0 + 1:p0 + n_rows + 1]
                exact.append(shortlist_logprob(z, tgt, V))
                for n in ns:
                    approx[n].append(shortlist_logprob(z, tgt, n))
                print(f"{name} {text}: {p0 + n_rows}/{tokens}", file=sys.stderr, flush=True)
        finally:
            ctx.close()
        ex = np.concatenate(exact)
        t = round(nuc_ratio * (budget // 2))
        want = lowest(ex, budget, t)
        rows = []
        for n in ns:
            ap = np.concatenate(approx[n])
            kept = [len(a & b) / t for a, b in zip(want, lowest(ap, budget, t))]
            err = np.abs(ap - ex)
            rows.append(dict(shortlist=n, head_share=n / V, targets_outside=float(np.mean(toks[1:] >= n)),
                             dlogp_median=float(np.median(err)), dlogp_p95=float(np.percentile(err, 95)),
                             nuc_kept_mean=float(np.mean(kept)), nuc_kept_min=float(np.min(kept))))
        return dict(model=name, text=text, n_vocab=V, tokens=tokens, budget=budget, t=t, windows=len(want),
                    rows=rows)
    finally:
        model.close()


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not 4 <= a.budget <= a.tokens or min(a.shortlist or SHORTLISTS) < 1 or a.chunk < 1:
        raise SystemExit("nuc_shortlist: --budget must be within [4, --tokens], --shortlist and --chunk at least 1")
    out = []
    for name in a.model or ["gemma3-270m"]:
        for text in a.text or ["manual"]:
            try:
                r = measure(name, text, a.tokens, a.budget, a.nuc_ratio, a.shortlist or list(SHORTLISTS),
                            a.chunk, a.threads)
            except KvpotError as e:
                raise SystemExit(f"nuc_shortlist: {e}") from None
            out.append(r)
            for row in r["rows"]:
                print(f"{name:20s} {text:6s} N={row['shortlist']:6d} ({row['head_share']:.3f} of the head): "
                      f"targets outside {row['targets_outside']:.0%}, |d log p| median {row['dlogp_median']:.3f} "
                      f"p95 {row['dlogp_p95']:.2f}; NuC's {r['t']} of {r['budget']} kept "
                      f"{row['nuc_kept_mean']:.1%} (least {row['nuc_kept_min']:.1%})")
    if a.json:
        write_text_file(a.json, json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
