"""Run the pot tests on a ggml device other than the CPU, and prove that they did.

KVPOT_TEST_DEVICE=vulkan (set by `make test-vulkan`) makes every model the tests load put its layers and
its KV cache (the pot) on the first Vulkan device. kvpot already asks llama.cpp for every layer on the
devices it has (runtime/llama.py, N_GPU_LAYERS_ALL); what the tests add is the proof: llama.cpp's load
log says, for each model and each context, which buffer holds the weights and the KV cache, and
`check_used` fails a test whose models or pot stayed on the CPU. Without it a Vulkan build that found no
device would run every test on the CPU and pass, proving nothing.
"""

from __future__ import annotations

import os
import re

DEVICE = os.environ.get("KVPOT_TEST_DEVICE", "")
# ggml backend device names start with these (ggml_backend_dev_name: "Vulkan0", "CUDA0", ...)
PREFIXES = {"vulkan": "Vulkan"}

if DEVICE == "vulkan":
    # ggml-vulkan passes over Vulkan devices of type CPU (Mesa's lavapipe, llvmpipe) unless named here;
    # set before libllama loads. A machine with a real GPU may override it.
    os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

# the load-log lines that name a buffer's device: weights, KV cache, compute buffers
KEYS = ("model buffer size", "KV buffer size", "compute buffer size", "using device", "layers to GPU")


def devices() -> list[tuple[str, str]]:
    """(name, description) of every ggml device of the loaded runtime, in llama.cpp's order."""
    from kvpot.runtime.devices import devices as ggml_devices

    return [(d.name, d.description) for d in ggml_devices()]


class LoadLog:
    """llama.cpp's buffer lines, read from the file kvpot's C log filter appends every message to
    (the filter keeps doing its job: errors to stderr, the rest dropped)."""

    def __init__(self):
        import tempfile
        from pathlib import Path

        from kvpot.runtime import logs
        from kvpot.runtime.library import load

        load()
        self.path = Path(tempfile.mkdtemp(prefix="kvpot-device-log-")) / "llama.log"
        logs.install(self.path)
        self.extra: list[str] = []  # lines of child processes (vulkan_checks' placement run)

    @property
    def lines(self) -> list[str]:
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        return [ln.strip() for ln in text.splitlines() if any(k in ln for k in KEYS)] + self.extra


_log: LoadLog | None = None


def load_log() -> LoadLog:
    global _log
    if _log is None:
        _log = LoadLog()
    return _log


def check_used(lines: list[str], prefix: str, need_model: bool = False) -> None:
    """Every model loaded so far chose the device and every KV cache (the pot) lives there. (llama.cpp
    keeps the token embeddings in host memory on every backend: a CPU model buffer beside it is normal.)
    need_model: the test used a model, so its load log must be there (a lost log would pass vacuously)."""
    if need_model:
        assert any("KV buffer size" in ln for ln in lines), "a test used a model but no KV cache was logged"
    bad = [ln for ln in lines if ": using device" in ln and f"using device {prefix}" not in ln]
    assert not bad, f"a model loaded on another device than {prefix}: {bad}"
    bad = [ln for ln in lines if "KV buffer size" in ln and f" {prefix}" not in ln.split("KV buffer size")[0]]
    assert not bad, f"a KV cache (the pot) was not on the {prefix} device: {bad}"
    # load_tensors: "offloaded 31/31 layers to GPU" (every repeating layer and the output layer)
    offload = [(ln, re.search(r"offloaded (\d+)/(\d+) layers", ln)) for ln in lines if "offloaded" in ln and "layers to GPU" in ln]
    bad = [ln for ln, m in offload if m is None or m.group(1) != m.group(2)]
    assert not bad, f"a model kept layers off the {prefix} device: {bad}"

