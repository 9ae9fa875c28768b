"""What a smaller retaining-head hidden size costs against the paper's 1024 (docs/locret.md).

Captures one set of samples (kept in --cache, so a rerun only fits), fits heads of each hidden size
with the same seed, data and steps, and prints the held-out Spearman correlation with the labels.

    KVPOT_HOME=... .venv/bin/python -m studies.locret_hidden smollm2-135m 32 1024 [--json OUT]

(`make bench-locret-hidden`); the rows are also written to OUT, locret-hidden-MODEL.json by default.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kvpot.converters.adapter import BaseIdentity
from kvpot.models.resolve import resolve_model
from kvpot.paths import home
from kvpot.runtime.llama import LlamaModel
from kvpot.safe_write import write_text_file
from kvpot.train.documents import default_sources, make_samples
from kvpot.train.locret import capture_all, heldout_spearman
from kvpot.train.locret_fit import FitConfig, evaluate, fit

N_TRAIN, N_HELD, LENGTH, STEPS, SEED = 16, 4, 512, 120, 0


def main(model: str, hiddens: list[int], json_out: Path | None = None) -> None:
    facts, _ = resolve_model(model)
    base = BaseIdentity.of_model(facts.path)
    vocab = LlamaModel(str(facts.path), vocab_only=True)
    try:
        train = make_samples(vocab, default_sources(), N_TRAIN, LENGTH, SEED)
        held = make_samples(vocab, default_sources(), N_HELD, LENGTH, SEED + 1_000_003)
    finally:
        vocab.close()
    data, layer_ids = capture_all(facts.path, train + held, base, threads=2, cache=home() / "train-cache")
    tr, te = data[:N_TRAIN], data[N_TRAIN:]
    out = []
    for hidden in hiddens:
        t0 = time.perf_counter()
        model_, _ = fit(tr, base, layer_ids, FitConfig(hidden=hidden, steps=STEPS, seed=SEED))
        row = {"hidden": hidden, "train_loss": evaluate(model_, tr, 0.0025), "heldout_loss": evaluate(model_, te, 0.0025),
               "heldout_spearman": heldout_spearman(model_, te), "fit_seconds": time.perf_counter() - t0}
        print(json.dumps(row), flush=True)
        out.append(row)
    write_text_file(json_out or Path(f"locret-hidden-{model}.json"), json.dumps(out, indent=1))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("hidden", type=int, nargs="+")
    ap.add_argument("--json", type=Path)
    return ap


if __name__ == "__main__":
    a = parser().parse_args()
    main(a.model, a.hidden, a.json)
