"""Copy a GGUF file with some of it changed: every metadata key (its value replaced where `value` says
so, its architecture prefix where `arch` names another), every tensor that `tensor` keeps (its data
and type replaced where it says so), and `extra` tensors added. Shared by the test tools that derive a model from a test model
(make_q4_0.py, cut_layers.py, as_qwen2.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_gguf(src: str, dst: str, value: Callable[[str, object], object] = lambda name, v: v,
              tensor: Callable[[object], tuple | None] = lambda t: (t.data, t.tensor_type),
              arch: str | None = None, extra: Iterable[tuple[str, np.ndarray]] = ()) -> None:
    """`value(name, v)`: the value written for key `name`; `tensor(t)`: (data, type) written for the
    reader's tensor t, or None to leave it out; `arch`: another architecture, whose name replaces the
    source's in every key that starts with it; `extra`: (name, float32 array) tensors added."""
    reader = GGUFReader(src)
    src_arch = reader.fields["general.architecture"].contents()
    arch = arch or src_arch
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        name = arch + field.name[len(src_arch):] if field.name.startswith(src_arch + ".") else field.name
        writer.add_key_value(name, value(name, field.contents()), field.types[0], sub_type=sub)
    for t in reader.tensors:
        kept = tensor(t)
        if kept is not None:
            data, qtype = np.asarray(kept[0]), kept[1]
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
    for name, data in extra:
        writer.add_tensor(name, np.asarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
