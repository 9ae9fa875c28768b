"""Write a Q4_0 copy of a GGUF model: every Q4_1 tensor dequantized and quantized again as Q4_0
(ggml's reference rounding, through the gguf package that llama.cpp vendors); other tensors and all
metadata are copied. For tests only: the weights are a requantization of Q4_1, not of the original
F16 model, so the copy is a little worse than an official Q4_0.

usage: PYTHONPATH=<llama.cpp>/gguf-py python make_q4_0.py IN.gguf OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from gguf_copy import copy_gguf

LLAMA_FTYPE_MOSTLY_Q4_0 = 2


def main(src: str, dst: str) -> None:
    converted = []

    def requantize(t):
        if t.tensor_type != Q.Q4_1:
            return t.data, t.tensor_type
        converted.append(t.name)
        return quantize(dequantize(np.asarray(t.data), Q.Q4_1), Q.Q4_0), Q.Q4_0

    copy_gguf(src, dst, value=lambda name, v: LLAMA_FTYPE_MOSTLY_Q4_0 if name == "general.file_type" else v,
              tensor=requantize)
    print(f"{dst}: {len(converted)} tensors Q4_1 -> Q4_0", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
