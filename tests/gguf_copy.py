"""Copy a GGUF file with some of it changed: every metadata key (a value replaced where `value` says so)
and every tensor that `tensor` keeps (its data and type replaced where it says so). Shared by the test
tools that derive a model from a test model (make_q4_0.py, cut_layers.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_gguf(src: str, dst: str, value: Callable[[str, object], object] = lambda name, v: v,
              tensor: Callable[[object], tuple | None] = lambda t: (t.data, t.tensor_type)) -> None:
    """`value(name, v)`: the value written for key `name`; `tensor(t)`: (data, type) written for the
    reader's tensor t, or None to leave it out."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value(field.name, field.contents()), field.types[0], sub_type=sub)
    for t in reader.tensors:
        kept = tensor(t)
        if kept is not None:
            data, qtype = np.asarray(kept[0]), kept[1]
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
