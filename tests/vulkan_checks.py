"""What only a device other than the CPU can show (`make test-vulkan` runs this file by its path; the name
keeps it out of `make test`): the device is there, and every node of kvpot's own graphs runs on it.

The exactness tests (test_pot*.py, ...) run on the device unchanged: conftest.py checks after each of
them that the models and the pot were there (tests/devicelib.py). Here ggml's scheduler says, node by
node, where kvpot's graph pieces ran (tests/sched_splits.py, GGML_SCHED_DEBUG=2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import devicelib
import pytest

HERE = Path(__file__).resolve().parent
PREFIX = devicelib.PREFIXES.get(devicelib.DEVICE, "")
# ggml's node lines print the backend's name cut to 5 characters ("Vulka"); split lines print it whole
NODE_PREFIX = PREFIX[:5]

# steps whose graph is all kvpot's: every node must run on the device, in one split
OWN_GRAPHS = ("compaction (gather)", "compaction + CR-RoPE", "compaction, ragged (per-layer live cells)",
              "InfLLM read-out (read_at)", "InfLLM insert", "memory fold")
# steps that add kvpot's nodes to llama.cpp's decode graph: no node may run on the CPU that the plain
# decode graph does not run there too
DECODES = ("decode + score tap", "decode + log-probs", "decode, per-layer masks", "decode + lookup query",
           "decode + retaining heads", "decode + memory read-out")


@pytest.fixture(scope="module")
def placement(smollm2_path, tmp_path_factory):
    if not PREFIX:
        pytest.fail("run with KVPOT_TEST_DEVICE=vulkan (make test-vulkan)")
    out = tmp_path_factory.mktemp("sched") / "splits.json"
    env = dict(os.environ, GGML_SCHED_DEBUG="2")
    res = subprocess.run([sys.executable, str(HERE / "sched_splits.py"), str(smollm2_path), str(out)],
                         env=env, capture_output=True, text=True, timeout=1200)
    (out.parent / "child.stderr").write_text(res.stderr)  # kept for a look when the child fails
    assert res.returncode == 0, f"exit {res.returncode} ({out.parent / 'child.stderr'}): {res.stderr[-3000:]}"
    report = os.environ.get("KVPOT_SPLITS_REPORT")
    if report:  # docs/pot.md's table is made from this file
        Path(report).write_text(out.read_text())
    placed = json.loads(out.read_text())
    # the child's load log joins this test run's, so conftest checks its models and pot like the others
    devicelib.load_log().extra.extend(placed.pop("load log"))
    return placed


def test_the_device_is_there():
    devs = devicelib.devices()
    assert any(name.startswith(PREFIX) for name, _ in devs), devs


def _off_device(graph: dict) -> list[tuple[str, str]]:
    return [(op, name) for op, name, backend in graph["nodes"] if not backend.startswith(NODE_PREFIX)]


@pytest.mark.parametrize("step", OWN_GRAPHS)
def test_kvpot_graphs_run_on_the_device(placement, step):
    graphs = placement[step]
    assert graphs, f"{step}: no graph was scheduled"
    for g in graphs:
        assert g["nodes"], step
        assert _off_device(g) == [], f"{step}: nodes off the device"
        assert [s["backend"] for s in g["splits"]] == [g["splits"][0]["backend"]], g["splits"]
        assert g["splits"][0]["backend"].startswith(PREFIX), g["splits"]


@pytest.mark.parametrize("step", DECODES)
def test_kvpot_nodes_in_the_decode_graph_stay_on_the_device(placement, step):
    stock = {node for g in placement["decode"] for node in _off_device(g)}
    graphs = placement[step]
    assert graphs, f"{step}: no graph was scheduled"
    for g in graphs:
        extra = [node for node in _off_device(g) if node not in stock]
        assert extra == [], f"{step}: kvpot nodes on the CPU"
        assert any(backend.startswith(NODE_PREFIX) for _, _, backend in g["nodes"]), step


@pytest.mark.parametrize("step", ["decode + retaining heads", "decode + memory read-out"])
def test_trained_weights_are_not_copied_into_each_graph(placement, step):
    """The retaining heads' and the memory gate's weights live on the layer's device (ggml_ext/kvpot-weights.h):
    their graphs copy no more inputs into the device's split than the plain decode graph does."""
    def inputs(graphs):
        return max(sp["inputs"] for g in graphs for sp in g["splits"] if sp["backend"].startswith(PREFIX))
    assert inputs(placement[step]) == inputs(placement["decode"]), placement[step][0]["splits"]


def test_passkey_found_after_compactions_on_the_device(smollm2_path):
    """One passkey case end to end (InfiniPot: CaP and NuC scores, CR-RoPE compactions, the answer) with
    the pot on the device; SmolLM2 and 1K tokens keep it to minutes on lavapipe."""
    from kvpot.bench.niah import read_and_ask
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import InfiniPot

    eng = Engine(str(smollm2_path), InfiniPot(pot=512, keep=256), EngineConfig(budget=512, chunk=128, n_threads=2))
    try:
        r = read_and_ask(eng, "infinipot", "smollm2-135m", 1024, 0.5, seed=1)
    finally:
        eng.close()
    assert r.compactions >= 3
    assert r.correct, f"key {r.key}, answer {r.answer!r}"
