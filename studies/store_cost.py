"""What InfLLM's block store costs per block read, by row format: a read the LRU cache misses (the
record read from the file with pread, decoded to f32) against one it serves, the bytes a block takes on
disk, and what the lookup's scoring costs per block stored (every lookup scores every block of a layer, so
this is the part of a chunk's time that grows with the input). The figures decide how large the in-RAM
cache is worth making (docs/pot.md).

    python -m studies.store_cost --json docs/bench/infllm/store-cost.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from kvpot.runtime import api
from kvpot.runtime.blocks import KV_TYPES, BlockStore
from kvpot.safe_write import write_text_file

# (name, KV heads, head dim, tokens per block): the registry's models at InfLLM's block size below 4096 cells
SHAPES = (("gemma3-270m", 1, 256, 64), ("qwen2.5-coder-1.5b", 2, 128, 64), ("smollm2-135m", 3, 64, 64))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.store_cost", description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4096, help="blocks per store (more than the cache holds; "
                                                            "4096 blocks of 64 are 256K tokens)")
    p.add_argument("--rounds", type=int, default=4, help="passes over the blocks, each read once a pass")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


def measure(n_head_kv: int, d: int, bs: int, kv_type: str, n_blocks: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp, BlockStore(
            Path(tmp) / "s.kvblk", n_layer=1, n_head_kv=n_head_kv, d_k=d, d_v=d, block_size=bs, kv_type=kv_type,
            max_cached=4, create=True) as store:
        for b in range(n_blocks):
            store.append(np.arange(b * bs, (b + 1) * bs, dtype=np.int32),
                         rng.standard_normal((1, n_head_kv, d), dtype=np.float32),
                         rng.standard_normal((1, n_head_kv, bs, d), dtype=np.float32),
                         rng.standard_normal((1, n_head_kv, bs, d), dtype=np.float32))
        pos = np.zeros(bs, dtype=np.int32)
        out = pos.ctypes.data_as(api.c_i32_p)

        def read(block: int) -> None:  # one C call, nothing copied out but the positions
            store.lib.kvpot_blocks_read(store.ptr, 0, block, out, None, None, None)

        t0 = time.perf_counter()
        for _ in range(rounds):
            for b in range(n_blocks):  # in order through a 4-block cache: every read misses
                read(b)
        miss = (time.perf_counter() - t0) / (rounds * n_blocks)
        t0 = time.perf_counter()
        for _ in range(rounds * n_blocks):
            read(0)
        hit = (time.perf_counter() - t0) / (rounds * n_blocks)
        info = store.info()
        assert info.misses >= rounds * n_blocks  # the first loop really missed
        q = rng.standard_normal((n_head_kv, d), dtype=np.float32)
        t0 = time.perf_counter()
        for _ in range(rounds):
            store.topk(0, q, 8)
        score = (time.perf_counter() - t0) / (rounds * n_blocks)
        return dict(kv_type=kv_type, n_head_kv=n_head_kv, head_dim=d, block_size=bs, miss_us=miss * 1e6,
                    hit_us=hit * 1e6, score_ns=score * 1e9, record_bytes=info.record_bytes)


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    rows = []
    for name, heads, d, bs in SHAPES:
        for kv_type in KV_TYPES:
            r = dict(model=name, **measure(heads, d, bs, kv_type, a.blocks, a.rounds))
            rows.append(r)
            print(f"{name:20s} {kv_type:5s} miss {r['miss_us']:7.1f} us  hit {r['hit_us']:5.1f} us  "
                  f"scoring {r['score_ns']:6.0f} ns a block  record {r['record_bytes']:,} B")
    if a.json:
        write_text_file(a.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
