"""The adapters shipped in models/ load as they are, and writing what was read back with kvpot's
writers (one header writer for every adapter type) gives the shipped bytes exactly."""

from __future__ import annotations

import gguf
import pytest

from kvpot.converters.adapter import (
    MEMORY_GATE,
    RETAINING_HEADS,
    read_memory_gate,
    read_retaining_heads,
    write_memory_gate,
    write_retaining_heads,
)
from kvpot.models.gguf_file import read_header
from kvpot.models.registry import KNOWN, SHIPPED_DIR

SHIPPED = sorted((m.name, kind, file) for m in KNOWN.values() for kind, file in m.adapters.items())


def test_adapters_are_shipped():
    assert {kind for _, kind, _ in SHIPPED} == {"locret", "edgeinfinite"}
    for _, _, file in SHIPPED:
        assert (SHIPPED_DIR / file).is_file(), file


@pytest.mark.parametrize(("model", "kind", "file"), SHIPPED)
def test_shipped_adapter_rewrites_byte_identical(model, kind, file, tmp_path):
    shipped = SHIPPED_DIR / file
    kv = read_header(shipped)
    source = kv.get("kvpot.source", "")
    out = tmp_path / file
    if kind == "locret":
        assert kv["adapter.type"] == RETAINING_HEADS
        (dtype,) = {t.tensor_type.name.lower() for t in gguf.GGUFReader(str(shipped)).tensors}
        adapter = read_retaining_heads(shipped)
        write_retaining_heads(out, adapter, dtype=dtype, source=source)
    else:
        assert kv["adapter.type"] == MEMORY_GATE
        adapter = read_memory_gate(shipped)
        write_memory_gate(out, adapter, source=source)
    assert adapter.base.sha256 == KNOWN[model].sha256  # made for the model the registry ships it with
    assert out.read_bytes() == shipped.read_bytes()
