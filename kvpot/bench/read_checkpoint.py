"""A long `bench throughput` read that saves where it is every few minutes, so that a stopped one goes on
from its last save (`--resume`) instead of from token 0. A 1M-token read is hours on a 2-core CPU: longer
than the process that runs it may live.

What a resumed read reports is what one uninterrupted read would: its tokens/s is the tokens over the
reading time of every part (the saves are not counted), its peak RSS the largest reading peak of the
parts. What a restore or a save holds for a moment beside the cache (the state it copies) is the
saving's, not the reading's: the peak is measured afresh after each (kvpot.bench.process.ReadingPeak).
Its computation is the same too: the engine's own export/import (what saved contexts hold) and the same
tokens from the same place, so the pot ends bit for bit where one read would have left it
(tests/test_bench_read_checkpoint.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kvpot.bench.process import ReadingPeak, rss_mb
from kvpot.errors import KvpotError
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import remove_stale_temps
from kvpot.state.engine_state import check_engine_values, check_policy_state, check_pot_bytes
from kvpot.state.state_container import one_line, read_state, write_state

FORMAT = "kvpot bench read"   # the header's "format": what tells a bench read's save from a saved context
WHAT = "bench checkpoint"


@dataclass
class ReadSoFar:
    tokens: int = 0                     # tokens read (the engine's tokens_seen, the BOS included)
    seconds: float = 0.0                # reading time, saves excluded
    peak_rss_mb: float = 0.0            # the largest reading peak of the parts so far
    rss_start_mb: float | None = None   # resident memory as the first part began reading
    kv_bytes: int = 0                   # the most pot bytes in use after any chunk
    parts: int = 0                      # processes that read a part (1: one uninterrupted read)
    saves: int = 0
    cpus: list[str] = field(default_factory=list)  # each part's CPU: a read in parts may span machines


class Stop(Exception):
    """Raised by an `on_saved` callback to stop the read right after a save (what a killed process does)."""


def timed_read(eng, n_tokens: int, key: dict, path: Path | None = None, every: float = 600.0,
               say: Callable[[str], None] = lambda msg: None, on_saved: Callable[[ReadSoFar], None] | None = None,
               pieces=None) -> ReadSoFar:
    """Read `n_tokens` (the BOS included) of the throughput bench's generated text into `eng`, timed.

    With `path`: go on from the read saved there, if any (it must have been saved for the same `key`),
    and save there after the first chunk that ends `every` seconds of reading after the last save. The
    caller deletes the file once the read's figures are kept. `pieces(skip)`: the input from its token
    `skip` on (default: kvpot.bench.logbook.generated_pieces)."""
    if pieces is None:
        from kvpot.bench.logbook import generated_pieces

        def pieces(skip):
            return generated_pieces(eng.model, n_tokens - len(eng.model.bos()), skip=skip)

    so_far = _load(path, eng, key) if path is not None and path.exists() else None
    resumed = so_far is not None
    peak = ReadingPeak()
    if resumed:
        peak.restart(0.0)  # the restore's own peak (the saved state held beside the cache) is not the reading's
    else:
        so_far = ReadSoFar(rss_start_mb=rss_mb())
    so_far.parts += 1
    so_far.cpus.append(describe_host())
    bos = len(eng.model.bos())
    skip = eng.tokens_seen - bos if resumed else 0
    saving = [0.0]  # seconds spent saving in this part
    t0 = time.perf_counter()
    last = [t0]

    def on_chunk(ev):
        so_far.kv_bytes = max(so_far.kv_bytes, ev.stats.bytes_used)
        now = time.perf_counter()
        if path is None or now - last[0] < every or eng.tokens_seen >= n_tokens:
            return
        read_for = so_far.seconds + (now - t0 - saving[0])
        reading = peak.now()
        snap = ReadSoFar(**{**asdict(so_far), "tokens": eng.tokens_seen, "seconds": read_for,
                            "peak_rss_mb": max(so_far.peak_rss_mb, reading), "saves": so_far.saves + 1})
        _save(path, eng, key, snap)
        peak.restart(reading)  # nor is the save's (the state exported beside the cache)
        so_far.saves = snap.saves
        after = time.perf_counter()
        saving[0] += after - now
        last[0] = after
        say(f"read {snap.tokens:,} of {n_tokens:,} tokens in {read_for:,.0f} s "
            f"({snap.tokens / max(read_for, 1e-9):,.0f} tok/s), peak RSS {snap.peak_rss_mb:,.0f} MiB; "
            f"saved, to go on from here with --resume")
        if on_saved is not None:
            on_saved(snap)

    # a resumed read tells the policy no length: it keeps the one told when the read began (saved with it)
    eng.feed_stream(pieces(skip), expected=None if resumed else n_tokens - bos, on_chunk=on_chunk)
    so_far.seconds += time.perf_counter() - t0 - saving[0]
    so_far.tokens = eng.tokens_seen
    so_far.peak_rss_mb = max(so_far.peak_rss_mb, peak.now())
    return so_far


def drop(path: Path) -> None:
    """Delete a read's save, and a temporary file a killed save to it left (kvpot.safe_write)."""
    path.unlink(missing_ok=True)
    remove_stale_temps(path)


def _save(path: Path, eng, key: dict, so_far: ReadSoFar) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_state(path, {"format": FORMAT, "key": key, "so_far": asdict(so_far)}, eng.export_state(), WHAT)


def _load(path: Path, eng, key: dict) -> ReadSoFar:
    """The saved read restored into `eng`; one clear line for a file that is not one, or another read's."""
    fix = "delete it to read from the start"
    try:
        meta, state = read_state(path, WHAT)
    except KvpotError as e:  # unreadable, cut short, altered, not such a file
        raise KvpotError(f"{e}; {fix}") from None
    if meta.get("format") != FORMAT:
        raise KvpotError(f"{path} is not a kvpot {WHAT} (it is a {str(meta.get('format'))[:40]!r}); {fix}")
    if meta.get("key") != key:
        raise KvpotError(f"{WHAT} {path} was saved by another read ({_differs(meta.get('key'), key)}); {fix}")
    try:
        so_far = _so_far(meta.get("so_far"))
        check_engine_values(state.values, state.arrays, eng.ctx.n_ctx)
        check_pot_bytes(state.pot, state.arrays["positions"], state.values["pos_next"])
        check_policy_state(eng.policy, state.values["policy"], state.arrays)
    except Exception as e:  # a wrong field in a file whose checksum holds: the checks raise many kinds
        raise KvpotError(f"{WHAT} {path} is malformed ({type(e).__name__}: {one_line(e)}); {fix}") from None
    eng.import_state(state)
    return so_far


def _so_far(saved) -> ReadSoFar:
    """The figures of a save, each of the type ReadSoFar declares (a dataclass checks none itself)."""
    if not isinstance(saved, dict) or set(saved) != {f.name for f in fields(ReadSoFar)}:
        raise ValueError("so_far does not hold the figures of a read")
    for name, value in saved.items():
        if name == "cpus":
            ok = isinstance(value, list) and all(isinstance(c, str) for c in value)
        elif name == "rss_start_mb" and value is None:
            ok = True
        else:
            kind = (int, float) if name.endswith("_mb") or name == "seconds" else int
            ok = isinstance(value, kind) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise ValueError(f"so_far.{name} is {str(value)[:40]!r}")
    return ReadSoFar(**saved)


def _differs(saved, wanted: dict) -> str:
    if not isinstance(saved, dict):
        return "it names no read"
    diff = [k for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k)]
    return ", ".join(f"{k} {saved.get(k)!r}, not {wanted.get(k)!r}" for k in diff[:3])
