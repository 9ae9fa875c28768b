"""Test helpers for the pot: raw contexts, chunked decoding, a NumPy RoPE, and a cb_eval tensor catcher."""

from __future__ import annotations

import ctypes

import numpy as np

from kvpot.models.gguf_file import read_header
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel


def decode_chunks(ctx: LlamaContext, tokens: list[int], chunk: int, pos0: int = 0) -> int:
    for s in range(0, len(tokens), chunk):
        ctx.decode(tokens[s:s + chunk], pos0 + s, logits="last")
    return pos0 + len(tokens)


def new_ctx(model: LlamaModel, n_ctx: int, chunk: int, flash_attn=False, type_k="f16", type_v="f16") -> LlamaContext:
    return LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=chunk, n_threads=2, flash_attn=flash_attn,
                                             type_k=type_k, type_v=type_v))


def rope_facts(model_path) -> dict:
    kv = read_header(model_path)
    arch = kv["general.architecture"]
    return {
        "base": float(kv[f"{arch}.rope.freq_base"]),
        # llama rotates adjacent pairs (NORM); gemma3 rotates halves (NEOX)
        "neox": arch in ("gemma3", "gemma2", "qwen2", "qwen3", "phi3"),
    }


def numpy_rope(x: np.ndarray, delta: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """Rotate rows x [n, d] by angles delta[n] * base^(-2i/d), as RoPE does."""
    n, d = x.shape
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    ang = delta.astype(np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    out = x.astype(np.float64).copy()
    if neox:
        a, b = x[:, : d // 2].astype(np.float64), x[:, d // 2:].astype(np.float64)
        out[:, : d // 2] = a * c - b * s
        out[:, d // 2:] = a * s + b * c
    else:
        a, b = x[:, 0::2].astype(np.float64), x[:, 1::2].astype(np.float64)
        out[:, 0::2] = a * c - b * s
        out[:, 1::2] = a * s + b * c
    return out


class _TensorHead(ctypes.Structure):
    # the leading fields of struct ggml_tensor (ggml.h): type, buffer, ne[4], nb[4]
    _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4)]


class TensorCatcher:
    """cb_eval callback that copies F32 tensors whose name is in `names` (test oracle only)."""

    def __init__(self, names: set[str], first: bool = False):
        """first: keep a name's first tensor of each graph (llama.cpp reuses names, e.g. "Qcur-0"
        for the projection, then for the RoPE'd result); default: the last."""
        import llama_cpp

        self.names = names
        self.first = first
        self.caught: dict[str, np.ndarray] = {}
        lib_dir = __import__("pathlib").Path(llama_cpp.llama_cpp._lib._name).parent
        self.ggml = ctypes.CDLL(str(next(lib_dir.glob("libggml-base.*"))))
        self.ggml.ggml_get_name.restype = ctypes.c_char_p
        self.ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        self.ggml.ggml_nbytes.restype = ctypes.c_size_t
        self.ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
        self.ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self.ggml.ggml_is_contiguous.restype = ctypes.c_bool
        self.ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t, ask, user_data):
        name = self.ggml.ggml_get_name(t).decode()
        if ask:
            return name in self.names
        head = _TensorHead.from_address(t)
        if head.type != 0 or not self.ggml.ggml_is_contiguous(t):
            raise AssertionError(f"{name}: expected a contiguous F32 tensor")
        shape = tuple(int(head.ne[i]) for i in range(4))
        buf = np.empty(shape[::-1], dtype=np.float32)
        self.ggml.ggml_backend_tensor_get(t, buf.ctypes.data, 0, self.ggml.ggml_nbytes(t))
        if not (self.first and name in self.caught):
            self.caught[name] = buf  # numpy order: [ne3, ne2, ne1, ne0]
        return True


def log_softmax_rows(ctx, n_rows: int) -> np.ndarray:
    """log_softmax of the first n_rows rows of logits a context returned, in float64."""
    rows = np.stack([ctx.logits_row(i) for i in range(n_rows)]).astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    return rows - (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))


def pot_logprobs(ctx, batch, targets, marked: str = "last") -> tuple[np.ndarray, np.ndarray]:
    """Decode `batch` at position 0 with the pot's log-prob request for `targets`; closes the context.
    Returns (log-probs of every row, the last row's logits)."""
    from kvpot.runtime.pot import Pot

    pot = Pot(ctx)
    pot.logprobs_request(0, targets)
    ctx.decode(batch, 0, logits=marked)
    got = pot.logprobs_get(len(batch))
    pot.logprobs_clear()
    last = ctx.logits_last()
    ctx.close()
    return got, last


class ShapeRecorder:
    """cb_eval callback that records the shape [ne0, ne1, ne2, ne3] of every node the graph computes, and
    asks for none of their data (test oracle only)."""

    def __init__(self):
        import llama_cpp

        self.shapes: list[tuple[int, int, int, int]] = []
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t, ask, user_data):
        if ask:
            head = _TensorHead.from_address(t)
            self.shapes.append(tuple(int(head.ne[i]) for i in range(4)))
        return False


def hadamard(n: int) -> np.ndarray:
    """Orthonormal Sylvester Walsh-Hadamard matrix; llama.cpp stores quantized K rotated by it."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def logbook_tokens(model: LlamaModel, n_entries: int, seed: int, n: int) -> list[int]:
    """The first n tokens (BOS included where the model has one) of a generated logbook."""
    from kvpot.bench.logbook import logbook

    toks = model.bos() + model.tokenize(logbook(n_entries=n_entries, seed=seed)[0])
    assert len(toks) >= n, f"the logbook has {len(toks)} tokens, fewer than {n}"
    return toks[:n]
