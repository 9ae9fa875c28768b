"""tests/pot_check (the program the CUDA and aarch64 checks run, docs/pot.md) on this machine's CPU, on
SmolLM2 cut to 4 blocks and on its qwen2 copy (tests/as_qwen2.py), in each of the cache and attention
setups tests/cuda_pot_check.sh runs: a run with 1 thread, then one with 2 threads given the first's
output as its reference, compared by tests/compare_pot_check.py (every part: kept cells, compaction on
identical cells, NuC, retaining heads, gated memory, InfLLM's lookup). So the suite keeps the other
machines' check runnable here, and any part that fails on a CPU fails here first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from as_qwen2 import main as as_qwen2

from kvpot.build.cross import build_native

HERE = Path(__file__).parent
SETUPS = {  # K cache, V cache, flash attention: as CONFIGS in tests/cuda_pot_check.sh
    "f16": ("f16", "f16", "0"),
    "k-q8_0": ("q8_0", "f16", "0"),
    "flash-f16": ("f16", "f16", "1"),
    "flash-q8_0": ("q8_0", "q8_0", "1"),
}


@pytest.fixture(scope="module")
def pot_check(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pot-check")
    with open(out / "build.log", "w") as log:
        return build_native(out, log)


@pytest.fixture(scope="module")
def cut_models(tmp_path_factory, smollm2_cut_path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cut")
    as_qwen2(str(smollm2_cut_path), str(d / "qwen2.gguf"))
    return {"llama": smollm2_cut_path, "qwen2": d / "qwen2.gguf"}


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_pot_check_runs_and_agrees_with_itself(arch, setup, pot_check, cut_models, tmp_path):
    k, v, fa = SETUPS[setup]
    env = {"POT_CHECK_TYPE_K": k, "POT_CHECK_TYPE_V": v, "POT_CHECK_FLASH": fa, "PATH": "/usr/bin:/bin"}
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    for threads, out, ref in (("1", a, []), ("2", b, [str(a)])):
        run = subprocess.run([str(pot_check), str(cut_models[arch]), threads, *ref], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"pot_check exit {run.returncode}: {run.stderr[-1500:]}"
        out.write_text(run.stdout)
    tags = {line.split()[0] for line in a.read_text().splitlines() if line.strip()}
    want = {"kept", "score", "stock", "logits", "top", "nuc", "nuc_ref", "heads", "heads_ref", "stock_q"}
    if k == "f16" and v == "f16":
        want |= {"memory", "memory_ref", "gated", "ungated", "lookup", "lookup_ref", "lookup_scores", "fetched", "fetched_ref",
                 "fetched_at", "fetched_at_ref", "recalled", "recalled_ref"}
    assert want <= tags, want - tags
    assert f"type_k {k} type_v {v} flash {fa}" in a.read_text()
    cmp = subprocess.run([sys.executable, str(HERE / "compare_pot_check.py"), str(a), str(b)],
                         capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr


def test_pot_check_refuses_a_quantized_v_without_flash_attention(pot_check, cut_models):
    run = subprocess.run([str(pot_check), str(cut_models["llama"]), "1"],
                         env={"POT_CHECK_TYPE_V": "q8_0", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "needs POT_CHECK_FLASH=1" in run.stderr
