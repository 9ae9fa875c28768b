"""A long document kvpot writes itself: a ship's logbook with one fact to find (`kvpot demo`,
`kvpot bench context`), and as many tokens of it as a throughput benchmark asks for."""

from __future__ import annotations

import random
from collections.abc import Iterator

_WEATHER = ["calm seas", "a steady westerly", "rain squalls", "thick fog", "a rising swell", "clear skies"]
_TASKS = ["mended the foresail", "pumped the bilge", "checked the charts", "tarred the rigging",
          "counted the water casks", "scrubbed the deck", "repaired a lantern", "took soundings"]
_CREW = ["Ada", "Bram", "Cato", "Dina", "Elio", "Fenna", "Goran", "Hilde"]


def logbook(n_entries: int = 60, seed: int = 7, fact_at: float = 0.5) -> tuple[str, str, str]:
    """Return (document, question, answer); the answer sits at depth fact_at of the entries."""
    rng = random.Random(seed)
    code = str(rng.randint(10000, 99999))
    fact_entry = int(fact_at * (n_entries - 1))
    lines = ["Logbook of the schooner Marrow, kept by the first mate.", ""]
    for day in range(1, n_entries + 1):
        who = rng.sample(_CREW, 2)
        lines.append(
            f"Day {day}. Wind and weather: {rng.choice(_WEATHER)}. We made {rng.randint(40, 140)} miles. "
            f"{who[0]} {rng.choice(_TASKS)} while {who[1]} {rng.choice(_TASKS)}. "
            f"Position noted at {rng.randint(10, 60)} degrees north."
        )
        if day - 1 == fact_entry:
            lines.append(f"The captain set the code of the strongbox to {code}. Remember it: the code is {code}.")
    return "\n".join(lines) + "\n", "What is the code of the strongbox?", code


def generated_pieces(model, n_tokens: int, seed: int = 0, skip: int = 0) -> Iterator[list[int]]:
    """n_tokens of generated text tokenized by `model` (a kvpot.runtime.llama.LlamaModel), one logbook of
    400 entries (~17K tokens) at a time: a reader that streams them holds one part, not the whole input, so
    its memory says what the reading holds (a 1M-token list is ~40 MiB of Python objects).

    `skip`: leave out the first `skip` of those tokens (a stopped read going on from where it was)."""
    left, part = n_tokens, 0
    while left > 0:
        text, _, _ = logbook(n_entries=400, seed=seed * 1000 + part, fact_at=2.0)  # fact_at > 1: no fact
        toks = model.tokenize(text)[:left]
        left -= len(toks)
        part += 1
        cut, skip = min(skip, len(toks)), skip - min(skip, len(toks))
        if len(toks) > cut:
            yield toks[cut:]


def generated_tokens(model, n_tokens: int, seed: int = 0) -> list[int]:
    """generated_pieces joined: the same n_tokens in one list."""
    return [t for piece in generated_pieces(model, n_tokens, seed) for t in piece]
