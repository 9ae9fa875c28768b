"""Write a GGUF model cut to its first N blocks (every other tensor and all metadata copied, the block
count set to N): a small real model for a machine that cannot take the whole file, such as a GPU
machine reached with a size limit (tests/cuda_pot_check.sh). Its answers are nonsense; the pot's
arithmetic on it is the same as on the whole model.

usage: python cut_layers.py IN.gguf OUT.gguf N
"""

from __future__ import annotations

import sys

from gguf import GGUFReader
from gguf_copy import copy_gguf


def main(src: str, dst: str, n: int) -> None:
    arch = GGUFReader(src).fields["general.architecture"].contents()
    copy_gguf(src, dst,
              value=lambda name, v: n if name == f"{arch}.block_count" else v,
              tensor=lambda t: None if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n
              else (t.data, t.tensor_type))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
