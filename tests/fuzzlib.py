"""What every fuzz module shares (tests/test_fuzz*.py, docs/fuzzing.md): the input budget, the property
check with its counts, the report file, and byte-level mutations.

Property: every input is either accepted or refused with one KvpotError line; nothing else
escapes (no IndexError, MemoryError, RecursionError, ...).
"""

from __future__ import annotations

import json
import os
import struct
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvpot.errors import KvpotError

EXAMPLES = int(os.environ.get("KVPOT_FUZZ_EXAMPLES", "300"))  # inputs per strategy
# inputs per Hypothesis example: each example costs ~1-2 ms of Hypothesis's own bookkeeping (saving and
# restoring the global random state, its tree of choices) whatever it draws, more than a raw input takes
# to check, so the long run draws a batch of inputs per example; the short run one, derandomized
BATCH = int(os.environ.get("KVPOT_FUZZ_BATCH", "1" if EXAMPLES <= 1000 else "25"))
FUZZ = settings(max_examples=-(-EXAMPLES // BATCH), deadline=None, derandomize=EXAMPLES <= 1000,
                suppress_health_check=list(HealthCheck), database=None)


def batch(strategy):
    return st.lists(strategy, min_size=BATCH, max_size=BATCH)

STATS: dict[str, dict] = {}


def record(target: str, accepted: bool, seconds: float) -> None:
    s = STATS.setdefault(target, {"inputs": 0, "accepted": 0, "refused": 0, "slowest_s": 0.0})
    s["inputs"] += 1
    s["accepted" if accepted else "refused"] += 1
    s["slowest_s"] = max(s["slowest_s"], round(seconds, 4))
    if s["inputs"] % 5000 == 0:  # a long run stopped early still leaves its true counts
        write_report()


def check(target: str, fn, data: bytes) -> None:
    t0 = time.perf_counter()
    try:
        fn(data)
        accepted = True
    except KvpotError as e:
        msg = str(e)
        assert msg and "\n" not in msg, repr(msg)
        accepted = False
    record(target, accepted, time.perf_counter() - t0)


def write_report() -> None:
    report = os.environ.get("KVPOT_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"inputs_per_strategy": EXAMPLES, "inputs_per_example": BATCH, "targets": STATS}, f, indent=1)


# Every strategy below is built once, at import: a strategy made inside a composite on each draw
# (st.sampled_from(a_list), a composite called with a new argument) is validated again every time,
# which made Hypothesis spend most of a structured input's ~5-20 ms on validation and the long run
# too slow to reach 100,000 inputs (docs/fuzzing.md). Mutations are drawn as a plan (what, where)
# from a fixed strategy and applied to the bytes in plain Python.

# -- mutations ---------------------------------------------------------------------------------------

_AT = st.integers(0, 1 << 16)  # an offset, taken modulo the input's length
_RUNS = (b"\xff" * 8, b"\x00" * 8, struct.pack("<Q", 1 << 63), struct.pack("<I", 1 << 31))
MUTATIONS = st.lists(st.one_of(
    st.tuples(st.just("flip"), _AT, st.integers(0, 7)),
    st.tuples(st.just("cut"), _AT, st.integers(1, 64)),
    st.tuples(st.just("insert"), _AT, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("overwrite"), _AT, st.sampled_from(_RUNS)),
), min_size=1, max_size=4)


def mutate(base: bytes, plan: list[tuple]) -> bytes:
    """Byte flips, cuts, insertions and 0xff/0x00/sign-bit runs, at offsets modulo the length."""
    data = bytearray(base)
    for kind, at, arg in plan:
        at = at % len(data) if data else 0
        if kind == "flip" and data:
            data[at] ^= 1 << arg
        elif kind == "cut":
            del data[at:at + arg]
        elif kind == "insert":
            data[at:at] = arg
        elif kind == "overwrite":
            data[at:at + len(arg)] = arg
    return bytes(data)
