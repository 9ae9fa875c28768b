"""The default pot past what full attention can read: for a model measured there, the size that answered best
(KnownModel.beyond_window_pot; beyond_window_pot_asked when the question is known before reading;
beyond_window_pot_focused when, as well, `kvpot ask`'s focused read will answer), not the largest the device holds.

With no policy named, `--budget auto` reads an input that does not fit the device's context or the model's
trained context with InfiniPot. Past the window a larger pot is not always better: it can keep more of what does
not answer, read slower and hold more memory. So a model measured on real-document questions there takes the
size that answered best the way it is asked:
  - the question unknown while reading (`kvpot chat`);
  - the question known first and the pot answering (`kvpot ask` on a pipe or with `--no-focus`: InfiniPot
    distills toward the question, CaP-Q);
  - the question known first and the focused read answering (`kvpot ask` on files: the pot only locates the
    passages, which are read again with full attention, kvpot.session.focus; locating survives a small pot
    better than the facts do).
A model not measured there keeps the largest pot the device holds, as the test models do (on their
accuracy-versus-budget curves no smaller pot answered better). A policy named with `--policy` keeps
`--budget auto`'s meaning for it: the largest pot the device holds.

The measurements: docs/benchmarks.md, "Beyond the window" and "The focused read".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvpot.models.gguf_file import ModelFacts
from kvpot.models.model_hash import model_sha256
from kvpot.models.registry import KNOWN

EVIDENCE = "docs/benchmarks.md, Beyond the window"


class Asking(Enum):
    """When the question is known and what answers it: each default pot was measured one of these ways, and the
    value is how the plan's reason says it ("... when the question <value>")."""
    LATER = "is not known while reading"        # `kvpot chat`: the question comes after reading
    FIRST = "is known before reading"           # `kvpot ask` where the pot answers (a pipe, --no-focus)
    FOCUSED = "is known before reading and the passages it finds are read again (--focus)"  # `ask` on files

    @classmethod
    def of(cls, question_first: bool, focused: bool = False) -> Asking:
        """How a session is answered: `question_first`, its question is known before reading (ask; chat's comes
        later); `focused`, its focused read will answer (ask on inputs that can be read again, --focus), which
        needs the question first."""
        return cls.LATER if not question_first else cls.FOCUSED if focused else cls.FIRST


@dataclass(frozen=True)
class MeasuredPot:
    cells: int
    asking: Asking   # the way it was measured (FIRST where FOCUSED was asked for but not measured)


def pot_of(k, asking: Asking = Asking.LATER) -> MeasuredPot | None:
    """Known model `k`'s pot measured best past the window when asked as `asking` is; a focused read on a model
    measured only with the pot answering takes the pot measured that way (and says so)."""
    cells = {Asking.LATER: k.beyond_window_pot, Asking.FIRST: k.beyond_window_pot_asked,
             Asking.FOCUSED: k.beyond_window_pot_focused}[asking]
    if asking is Asking.FOCUSED and not cells:
        return pot_of(k, Asking.FIRST)
    return MeasuredPot(cells, asking) if cells else None


def measured_pot(facts: ModelFacts, asking: Asking = Asking.LATER) -> MeasuredPot | None:
    """The pot measured best past the window for this model file, asked as `asking` is (pot_of), if it is a
    known model measured there (by its size first, so no other file is hashed)."""
    def pot(k) -> MeasuredPot | None:
        return pot_of(k, asking)

    candidates = [k for k in KNOWN.values() if pot(k) and k.size_bytes == facts.file_bytes]
    if not candidates:
        return None
    sha = model_sha256(facts.path)
    return next((pot(k) for k in candidates if k.sha256 == sha), None)


def measured_sizes() -> str:
    """The measured sizes of every known model, for --help ("qwen2.5-coder-1.5b 2,048 cells for ask on files and
    16,384 cells for ask on a pipe and 2,048 cells for chat; ..."), written from the registry so the help says
    what the code does."""
    said = []
    for k in KNOWN.values():
        focused = k.beyond_window_pot_focused
        asked = (("ask on files", focused), ("ask on a pipe", k.beyond_window_pot_asked)) if focused else \
            (("ask", k.beyond_window_pot_asked),)
        parts = [f"{pot:,} cells for {cmd}" for cmd, pot in (*asked, ("chat", k.beyond_window_pot)) if pot]
        if parts:
            said.append(f"{k.name} {', '.join(parts[:-1]) + ' and ' if len(parts) > 1 else ''}{parts[-1]}")
    return "; ".join(said)


def default_pot(largest: int, measured: MeasuredPot) -> tuple[int, str]:
    """The default path's pot for a device that holds `largest` cells of pot and a model `measured` best past the
    window, and why, for stderr."""
    if largest <= measured.cells:
        return largest, f"the pot takes {largest:,} cells, all the device holds"
    return measured.cells, (f"the pot takes {measured.cells:,} cells, the size that answered best past the window "
                            f"for this model when the question {measured.asking.value} ({EVIDENCE}); the device "
                            f"holds up to {largest:,}")
