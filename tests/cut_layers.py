"""Write a GGUF model cut to its first N blocks (every other tensor and all metadata copied, the block
count set to N): a small real model for a machine that cannot take the whole file, such as a GPU
machine reached with a size limit (tests/cuda_pot_check.sh). Its answers are nonsense; the pot's
arithmetic on it is the same as on the whole model.

usage: python cut_layers.py IN.gguf OUT.gguf N
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main(src: str, dst: str, n: int) -> None:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = n if field.name == f"{arch}.block_count" else field.contents()
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
            continue
        writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
