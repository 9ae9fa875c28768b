"""The default pot past what full attention can read: for a model measured there, the size that answered best
(KnownModel.beyond_window_pot, and beyond_window_pot_asked when the question is known before reading), not the
largest the device holds.

With no policy named, `--budget auto` reads an input that does not fit the device's context or the model's
trained context with InfiniPot. On real-document questions past the window (docs/benchmarks.md, "Beyond the
window"), Qwen2.5-Coder-1.5B read as `kvpot chat` reads (the question unknown while reading) answered best
with a 2,048-cell pot: a larger one kept more of what did not answer, read slower and held more memory. Read
as `kvpot ask` reads (the question known first: InfiniPot distills with it as the catalyst, CaP-Q) it answered
best with 16,384 cells (7/8: every question 8,192 cells answered, and one more), more than with 8,192 (6/8) or
2,048 (3/8) and more than it knows with no document (3/8), at 0.7x 8,192 cells' speed, about stock llama.cpp's
prefill speed at 8K and twice its speed at 32K. The 0.5B, question first,
answered more with 8,192 cells (6/8) than with its largest pot (4/8) or 2,048 (3/8), faster than the largest and
in under half its memory; read as chat reads it answered more with its largest pot (2/8 against 1/8 at 2,048 cells), so it
keeps the largest there. For the test models the
accuracy-versus-budget curves found no smaller pot better, so they keep the largest, as does any model not
measured there. A policy named with `--policy` keeps
`--budget auto`'s meaning for it: the largest pot the device holds.
"""

from __future__ import annotations

from kvpot.models.gguf_file import ModelFacts

EVIDENCE = "docs/benchmarks.md, Beyond the window"


def measured_pot(facts: ModelFacts, question_first: bool = False) -> int | None:
    """The pot measured best past the window for this model file, read with the question known first (`kvpot
    ask`) or not (`kvpot chat`), if it is a known model measured there (by its size first, so no other file is
    hashed)."""
    from kvpot.models.model_hash import model_sha256
    from kvpot.models.registry import KNOWN

    def pot(k) -> int | None:
        return k.beyond_window_pot_asked if question_first else k.beyond_window_pot

    candidates = [k for k in KNOWN.values() if pot(k) and k.size_bytes == facts.file_bytes]
    if not candidates:
        return None
    sha = model_sha256(facts.path)
    return next((pot(k) for k in candidates if k.sha256 == sha), None)


def measured_sizes() -> str:
    """The measured sizes of every known model, for --help ("qwen2.5-coder-1.5b 16,384 cells for ask and 2,048 cells
    for chat; ..."), written from the registry so the help says what the code does."""
    from kvpot.models.registry import KNOWN

    said = []
    for k in KNOWN.values():
        parts = [f"{pot:,} cells for {cmd}" for cmd, pot in (("ask", k.beyond_window_pot_asked),
                                                              ("chat", k.beyond_window_pot)) if pot]
        if parts:
            said.append(f"{k.name} {' and '.join(parts)}")
    return "; ".join(said)


def default_pot(largest: int, measured: int, question_first: bool = False) -> tuple[int, str]:
    """The default path's pot for a device that holds `largest` cells of pot and a model measured best at
    `measured`, and why, for stderr."""
    if largest <= measured:
        return largest, f"the pot takes {largest:,} cells, all the device holds"
    how = "is known before reading" if question_first else "is not known while reading"
    return measured, (f"the pot takes {measured:,} cells, the size that answered best past the window for this "
                      f"model when the question {how} ({EVIDENCE}); the device holds up to {largest:,}")
