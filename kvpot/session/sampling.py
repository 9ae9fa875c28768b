"""Choosing each answer token from the logits, with llama.cpp's sampling options, names and order.

llama.cpp's common sampler applies, in this order: repetition penalty over the last `repeat_last_n`
tokens, top-k, top-p, min-p (each on the probabilities of the logits as they stand, before the
temperature), then the temperature, then one draw. A temperature of 0 or less is greedy: the most
likely token after the penalty, as `kvpot ask` does by default (the same answer every time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError

# llama.cpp's defaults (common/common.h); ask and run default to greedy (temp 0) instead
DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_MIN_P, DEFAULT_REPEAT_PENALTY, REPEAT_LAST_N = 40, 0.95, 0.05, 1.0, 64


@dataclass
class Sampler:
    temp: float = 0.0
    top_k: int = DEFAULT_TOP_K            # 0: off
    top_p: float = DEFAULT_TOP_P          # 1.0: off
    min_p: float = DEFAULT_MIN_P          # 0.0: off
    repeat_penalty: float = DEFAULT_REPEAT_PENALTY  # 1.0: off
    seed: int | None = None               # None: a new random seed each run
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, ok, allowed in (("temp", self.temp >= 0, ">= 0"), ("top_k", self.top_k >= 0, ">= 0"),
                                  ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
                                  ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
                                  ("repeat_penalty", self.repeat_penalty > 0, "> 0")):
            value = getattr(self, name)
            if not ok or not math.isfinite(value):  # inf passes the comparisons, and samples nothing sensible
                raise KvpotError(f"--{name.replace('_', '-')} must be {allowed} and finite, got {value}")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise KvpotError(f"--seed must be in 0 … {2**32 - 1}, got {self.seed}")
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    def pick(self, logits: np.ndarray, recent: list[int]) -> int:
        """The next token from the last position's logits; `recent`: the tokens generated so far."""
        z = np.asarray(logits, dtype=np.float64).copy()
        if self.repeat_penalty != 1.0 and recent:
            ids = np.unique(np.asarray(recent[-REPEAT_LAST_N:], dtype=np.int64))
            z[ids] = np.where(z[ids] > 0, z[ids] / self.repeat_penalty, z[ids] * self.repeat_penalty)
        if self.greedy:
            return int(np.argmax(z))
        keep = np.argsort(-z, kind="stable")              # candidates, most likely first
        if 0 < self.top_k < len(keep):
            keep = keep[:self.top_k]
        p = _softmax(z[keep])
        if self.top_p < 1.0:  # the smallest prefix whose mass reaches top_p
            n = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            keep, p = keep[:n], p[:n]
        if self.min_p > 0:    # tokens at least min_p times as likely as the most likely one
            p = _softmax(z[keep])
            n = max(1, int(np.sum(p >= self.min_p * p[0])))
            keep = keep[:n]
        p = _softmax(z[keep] / self.temp)
        return int(keep[self._rng.choice(len(keep), p=p)])


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()
