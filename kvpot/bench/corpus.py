"""Generated benchmark text: kvpot's own logbook prose, as many tokens as asked for."""

from __future__ import annotations

from kvpot.sample import logbook


def generated_tokens(model, n_tokens: int, seed: int = 0) -> list[int]:
    """At least n_tokens of generated text tokenized by `model` (a kvpot.runtime.llama.LlamaModel), cut to n."""
    out: list[int] = []
    part = 0
    while len(out) < n_tokens:
        text, _, _ = logbook(n_entries=400, seed=seed * 1000 + part, fact_at=2.0)  # fact_at > 1: no fact
        out.extend(model.tokenize(text))
        part += 1
    return out[:n_tokens]
