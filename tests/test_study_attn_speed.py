"""studies.attn_speed builds tests/attn_speed.c against this machine's libggml and runs it: the two ways
llama.cpp attends on the CPU (flash attention, and K·Q, soft_max, V·KQ with V transposed) give the same
result for the same chunk and cells, which is what makes `--flash-attn auto` a choice of speed and memory
only, and the bench's JSON holds what its table shows."""

from __future__ import annotations

import json

from studies import attn_speed


def test_both_attention_paths_agree_and_are_timed(tmp_path, smollm2_path):
    exe = attn_speed.build()
    for shape in ((64, 9, 3, 700, 37), (128, 12, 2, 300, 64)):  # SmolLM2's heads; the 1.5B Qwen model's
        r = attn_speed.measure(exe, *shape, threads=2, reps=1)
        # test-backend-ops' bound for flash attention against the unfused ops
        assert r["nmse"] < 5e-4, (shape, r)
        assert r["off_ms"] > 0 and r["on_ms"] > 0
    out = tmp_path / "attn.json"
    assert attn_speed.main(["-m", str(smollm2_path), "--cells", "256", "--rows", "32", "--reps", "1", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    (row,) = got["results"]
    assert (row["cells"], row["head_dim"], row["n_head"], row["n_head_kv"], row["n_global_layers"]) == (256, 64, 9, 3, 30)
    assert got["rows"] == 32 and got["cpu"]
