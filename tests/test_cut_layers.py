"""tests/cut_layers.py, the tool behind the cut models of conftest.py: the cut file is the source's
metadata with the block count changed, and the source's tensors but for the blocks left out, each with
its own bytes (read back through gguf-py, an independent reader)."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader

from kvpot.models.gguf_file import read_header


def test_the_cut_file_holds_the_first_blocks_as_the_source_has_them(smollm2_path, smollm2_cut_path):
    src, cut = read_header(smollm2_path), read_header(smollm2_cut_path)
    assert src["llama.block_count"] == 30 and cut["llama.block_count"] == 4
    assert {k: v for k, v in cut.items() if k != "llama.block_count"} == \
        {k: v for k, v in src.items() if k != "llama.block_count"}
    a, b = GGUFReader(str(smollm2_path)), GGUFReader(str(smollm2_cut_path))
    want = {t.name: t for t in a.tensors if not (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= 4)}
    got = {t.name: t for t in b.tensors}
    assert list(got) == list(want) and "blk.3.attn_q.weight" in got and "output_norm.weight" in got
    for name, t in got.items():
        assert t.tensor_type == want[name].tensor_type and list(t.shape) == list(want[name].shape), name
        np.testing.assert_array_equal(np.asarray(t.data), np.asarray(want[name].data), err_msg=name)
