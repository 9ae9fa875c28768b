"""Write a llama-architecture GGUF as a qwen2 one: the same tensors and metadata under the qwen2 name,
plus seeded Q, K and V biases in every block. llama.cpp then builds Qwen2's graph for it (NEOX RoPE,
the biases added to Q, K and V before RoPE), so tests/pot_check exercises that architecture on a
machine that cannot take a real Qwen2 file (tests/cuda_pot_check.sh: the smallest, Qwen2.5-0.5B, is
over its 64 MiB limit even cut to 4 blocks, its vocabulary alone being ~110 MB). Its answers are
nonsense; the pot's arithmetic on it is Qwen2's.

usage: python as_qwen2.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGUFReader
from gguf_copy import copy_gguf


def main(src: str, dst: str) -> None:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise SystemExit(f"as_qwen2: {src} is {arch}, not llama")
    n_layer = reader.fields["llama.block_count"].contents()
    n_embd = reader.fields["llama.embedding_length"].contents()
    n_head = reader.fields["llama.attention.head_count"].contents()
    n_kv = reader.fields["llama.attention.head_count_kv"].contents()
    d_kv = n_embd // n_head * n_kv
    rng = np.random.default_rng(2)
    # biases of the size Qwen2's have (its K biases are large): they move scores, so a tap or capture
    # that missed them would show
    extra = [(f"blk.{i}.attn_{w}.bias", rng.uniform(-1.0, 1.0, n).astype(np.float32))
             for i in range(n_layer) for w, n in (("q", n_embd), ("k", d_kv), ("v", d_kv))]
    copy_gguf(src, dst, arch="qwen2", extra=extra)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
