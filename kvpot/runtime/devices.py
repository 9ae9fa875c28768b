"""ggml's devices as llama.cpp sees them, read through the libllama that llama_cpp loaded, and the ones
a model's layers (and so the KV cache, the pot) go to.

The lookup goes through libllama's own handle: the wheel ships libggml.so and libggml.so.0 as two
copies of one file, and loading one by name would give a second ggml with its own device registry.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from kvpot.runtime.library import load as load_runtime

# ggml-backend.h: enum ggml_backend_dev_type
CPU, GPU, IGPU, ACCEL, META = 0, 1, 2, 3, 4
KINDS = {CPU: "CPU", GPU: "GPU", IGPU: "IGPU", ACCEL: "ACCEL", META: "META"}

# (name, restype, argtypes), C signature beside each
_SIGNATURES = [
    # size_t ggml_backend_dev_count(void);
    ("ggml_backend_dev_count", ctypes.c_size_t, []),
    # ggml_backend_dev_t ggml_backend_dev_get(size_t index);
    ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
    # const char * ggml_backend_dev_name(ggml_backend_dev_t device);
    ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
    # const char * ggml_backend_dev_description(ggml_backend_dev_t device);
    ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
    # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
    ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
    # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
    ("ggml_backend_dev_memory", None, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    # ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
    ("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p]),
    # const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
    ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
    # void ggml_backend_register(ggml_backend_reg_t reg);
    ("ggml_backend_register", None, [ctypes.c_void_p]),
]


@functools.lru_cache(maxsize=1)
def ggml() -> ctypes.CDLL:
    """ggml's device API, declared once per process, resolving in the very libraries libllama is linked against."""
    lib = ctypes.CDLL(load_runtime()._name)  # new function objects, same loaded libraries
    for name, restype, argtypes in _SIGNATURES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


@dataclass(frozen=True)
class Device:
    name: str         # "CPU", "CUDA0", "Vulkan0", "RPC0[127.0.0.1:50052]" ...
    description: str
    kind: str         # CPU, GPU, IGPU, ACCEL or META
    backend: str      # the registry's name: "CPU", "CUDA", "RPC" ...
    free_bytes: int
    total_bytes: int
    handle: int       # ggml_backend_dev_t, for calls that take the device


def devices() -> list[Device]:
    """Every registered ggml device, in llama.cpp's order."""
    g = ggml()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        reg = g.ggml_backend_dev_backend_reg(d)
        out.append(Device(name=g.ggml_backend_dev_name(d).decode(), description=g.ggml_backend_dev_description(d).decode(),
                          kind=KINDS.get(g.ggml_backend_dev_type(d), "?"),
                          backend=g.ggml_backend_reg_name(reg).decode() if reg else "",
                          free_bytes=free.value, total_bytes=total.value, handle=d))
    return out


def layer_devices(devs: list[Device]) -> list[Device]:
    """The devices llama.cpp spreads a model's layers over when every layer is offloaded (kvpot asks
    for that): RPC servers first, then discrete GPUs, then integrated GPUs only when there is no
    discrete one (llama_model_load's device list in the pinned llama.cpp). Empty: the CPU holds them."""
    rpc = [d for d in devs if d.kind == "GPU" and d.backend == "RPC"]
    gpus = [d for d in devs if d.kind == "GPU" and d.backend != "RPC"]
    igpus = [d for d in devs if d.kind == "IGPU"]
    return rpc + gpus + ([] if gpus else igpus)
