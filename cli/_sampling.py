"""The answer's sampling and stop options, shared by ask, chat and run, with llama.cpp's names and defaults
(except --temp: 0, greedy, so the same question on the same document gives the same answer)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvpot.display import require_utf8
from kvpot.errors import KvpotError
from kvpot.session.sampling import (
    DEFAULT_MIN_P,
    DEFAULT_REPEAT_PENALTY,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    REPEAT_LAST_N,
    Sampler,
)

PANEL = "Sampling"
TempOpt = Annotated[float, typer.Option(
    "--temp", rich_help_panel=PANEL, help="temperature; 0: greedy, the same every time")]
TopKOpt = Annotated[int, typer.Option("--top-k", rich_help_panel=PANEL,
                                      help="sample from the k likeliest tokens (0: all)")]
TopPOpt = Annotated[float, typer.Option("--top-p", rich_help_panel=PANEL,
                                        help="sample from the likeliest tokens of mass p")]
MinPOpt = Annotated[float, typer.Option("--min-p", rich_help_panel=PANEL,
                                        help="drop tokens under p times the likeliest one")]
RepeatPenaltyOpt = Annotated[float, typer.Option(
    "--repeat-penalty", rich_help_panel=PANEL,
    help=f"penalize the last {REPEAT_LAST_N} tokens (1.0: off)")]
SeedOpt = Annotated[int, typer.Option("--seed", "-s", rich_help_panel=PANEL,
                                      help="seed for --temp > 0 (-1: a new one each run)")]
StopOpt = Annotated[list[str], typer.Option(
    "--stop", rich_help_panel=PANEL, metavar="TEXT", show_default="none",
    help="end the answer at this text; repeatable")]

DEFAULTS = dict(temp=0.0, top_k=DEFAULT_TOP_K, top_p=DEFAULT_TOP_P, min_p=DEFAULT_MIN_P,
                repeat_penalty=DEFAULT_REPEAT_PENALTY, seed=-1)


def make_sampler(temp: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int) -> Sampler:
    """The options as a Sampler; a value out of range is one line naming the option."""
    return Sampler(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                   seed=None if seed == -1 else seed)


def stops(values: list[str] | None) -> tuple[str, ...]:
    """The --stop texts, checked before any reading: an empty one would end nothing (or everything), and
    one that is not UTF-8 could never appear in an answer."""
    for v in values or []:
        if not v:
            raise KvpotError('--stop takes the text that ends the answer, got an empty one ("")')
        require_utf8(v, "a --stop text")
    return tuple(values or [])
