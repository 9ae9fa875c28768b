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
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

LLAMA_FTYPE_MOSTLY_Q4_0 = 2


def main(src: str, dst: str) -> None:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        if field.name == "general.file_type":
            value = LLAMA_FTYPE_MOSTLY_Q4_0
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    n_conv = 0
    for t in reader.tensors:
        data, qtype = t.data, t.tensor_type
        if qtype == Q.Q4_1:
            data = quantize(dequantize(np.asarray(data), Q.Q4_1), Q.Q4_0)
            qtype = Q.Q4_0
            n_conv += 1
        writer.add_tensor(t.name, np.asarray(data), raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{dst}: {n_conv} of {len(reader.tensors)} tensors Q4_1 -> Q4_0", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
