"""kvpot adapter GGUF files: trained parts that run beside a base model (Locret's retaining heads;
EdgeInfinite's memory gate joins with adapter.type = kvpot.memory_gate).

An adapter carries the identity of the base model it was made for, and is checked against the
model in Python, with one clear line per problem, before any of it reaches C code. Format:
docs/formats.md, "Adapters".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import check_gguf_header, read_header
from kvpot.models.model_hash import model_sha256

FORMAT_VERSION = 1
RETAINING_HEADS = "kvpot.retaining_heads"

# the model's hidden_act, which Locret's retaining heads use (section 3; fc2(act(fc1(x)))), by GGUF architecture
ACTIVATIONS = {"llama": "silu", "mistral": "silu", "qwen2": "silu", "qwen3": "silu", "phi3": "silu",
               "gemma": "gelu", "gemma2": "gelu", "gemma3": "gelu"}


class AdapterError(KvpotError):
    """An adapter file that cannot be used with this model (or at all)."""


@dataclass(frozen=True)
class BaseIdentity:
    """What an adapter must agree with: the architecture, the attention shapes its tensors follow,
    and the base GGUF's sha256 (dimensions alone would let the heads of one fine-tune load on
    another of the same shape, where their scores mean nothing)."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_embd: int
    sha256: str

    @classmethod
    def of_model(cls, path: Path) -> BaseIdentity:
        path = Path(path)
        check_gguf_header(path)
        kv = read_header(path)
        arch = kv.get("general.architecture")
        if not arch or kv.get("general.type") not in (None, "model"):
            raise AdapterError(f"{path} is not a llama.cpp model GGUF")

        def num(key: str, default: int = 0) -> int:
            v = kv.get(f"{arch}.{key}")
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

        n_head, n_embd = num("attention.head_count"), num("embedding_length")
        head_k = num("attention.key_length", n_embd // n_head if n_head else 0)
        return cls(arch=arch, n_layer=num("block_count"), n_head=n_head,
                   n_head_kv=num("attention.head_count_kv", n_head), head_dim_k=head_k,
                   head_dim_v=num("attention.value_length", head_k), n_embd=n_embd, sha256=model_sha256(path))

    def qkv_width(self) -> int:
        """Width of Locret's head input [Q; K; V] for one token: all query heads, then K and V."""
        return self.n_head * self.head_dim_k + self.n_head_kv * (self.head_dim_k + self.head_dim_v)

    def mismatch(self, other: BaseIdentity) -> str | None:
        for name in ("arch", "n_layer", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_embd", "sha256"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                shown = (a[:12] + "…", b[:12] + "…") if name == "sha256" else (a, b)
                return f"{name} {shown[0]} (adapter) vs {shown[1]} (model)"
        return None


@dataclass
class RetainingHeads:
    """Locret's retaining heads: per layer, score = fc2 · act(fc1 · [Q; K; V]) for each token,
    one score per KV head; Q, K, V are the layer's projections of its normed input, before RoPE."""

    base: BaseIdentity
    activation: str
    fc1: list[np.ndarray] = field(default_factory=list)  # per layer [hidden, qkv_width]
    fc2: list[np.ndarray] = field(default_factory=list)  # per layer [n_head_kv, hidden]

    @property
    def hidden(self) -> int:
        return int(self.fc1[0].shape[0])

    def scores(self, layer: int, qkv: np.ndarray) -> np.ndarray:
        """Reference scores [n_tokens, n_head_kv] for qkv [n_tokens, qkv_width], in float64."""
        h = qkv.astype(np.float64) @ self.fc1[layer].astype(np.float64).T
        h = activate(self.activation, h)
        return h @ self.fc2[layer].astype(np.float64).T

    def check_shapes(self) -> None:
        b = self.base
        if len(self.fc1) != b.n_layer or len(self.fc2) != b.n_layer:
            raise AdapterError(f"retaining heads cover {len(self.fc1)} layers, the model has {b.n_layer}")
        hidden = self.hidden
        for il, (w1, w2) in enumerate(zip(self.fc1, self.fc2)):
            if w1.shape != (hidden, b.qkv_width()):
                raise AdapterError(f"layer {il}: fc1 is {list(w1.shape)}, expected [{hidden}, {b.qkv_width()}]")
            if w2.shape != (b.n_head_kv, hidden):
                raise AdapterError(f"layer {il}: fc2 is {list(w2.shape)}, expected [{b.n_head_kv}, {hidden}]")
            if not (np.isfinite(w1).all() and np.isfinite(w2).all()):
                raise AdapterError(f"layer {il}: the retaining head holds NaN or infinite weights")
        if self.activation not in ("silu", "gelu"):
            raise AdapterError(f"unknown activation {self.activation!r} (silu or gelu)")


def activate(name: str, x: np.ndarray) -> np.ndarray:
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":  # the tanh form, as Gemma's gelu_pytorch_tanh and ggml_gelu
        return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))
    raise AdapterError(f"unknown activation {name!r}")


def _tensor_names(il: int) -> tuple[str, str]:
    return f"blk.{il}.rh_fc1.weight", f"blk.{il}.rh_fc2.weight"


def write_retaining_heads(path: Path, heads: RetainingHeads, dtype: str = "f32", source: str = "") -> None:
    """Write an adapter GGUF. dtype: f32, f16, or bf16 (exact for heads published in bf16)."""
    import gguf

    heads.check_shapes()
    b = heads.base
    w = gguf.GGUFWriter(str(path), arch=b.arch)
    w.add_type("adapter")
    w.add_string("adapter.type", RETAINING_HEADS)
    w.add_uint32("kvpot.format_version", FORMAT_VERSION)
    for name in ("n_layer", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_embd"):
        w.add_uint32(f"kvpot.base.{name}", int(getattr(b, name)))
    w.add_string("kvpot.base.sha256", b.sha256)
    w.add_uint32("kvpot.retaining_heads.hidden", heads.hidden)
    w.add_string("kvpot.retaining_heads.activation", heads.activation)
    w.add_string("kvpot.retaining_heads.input", "q,k,v: the layer's attn_q, attn_k, attn_v of its normed input, "
                                                "before RoPE (and before any q/k norm)")
    if source:
        w.add_string("kvpot.source", source)
    for il in range(b.n_layer):
        for name, arr in zip(_tensor_names(il), (heads.fc1[il], heads.fc2[il])):
            _add_tensor(w, gguf, name, np.asarray(arr, dtype=np.float32), dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_tensor(w, gguf, name: str, arr: np.ndarray, dtype: str) -> None:
    if dtype == "f32":
        w.add_tensor(name, arr)
    elif dtype == "f16":
        w.add_tensor(name, arr.astype(np.float16))
    elif dtype == "bf16":
        bits = arr.view(np.uint32)
        if np.any(bits & 0xFFFF):
            raise AdapterError(f"{name} is not exactly representable in bf16; write it as f32")
        w.add_tensor(name, (bits >> 16).astype(np.uint16), raw_shape=arr.shape,
                     raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        raise ValueError(f"dtype {dtype!r}")


def _as_f32(t) -> np.ndarray:
    import gguf

    data = np.asarray(t.data)
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists ne[0] first
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        out = data.astype(np.float32)
    elif t.tensor_type == gguf.GGMLQuantizationType.F16:
        out = data.astype(np.float32)
    elif t.tensor_type == gguf.GGMLQuantizationType.BF16:
        out = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        raise AdapterError(f"tensor {t.name} has type {t.tensor_type.name}; adapters hold f32, f16 or bf16")
    return out.reshape(shape)


def _adapter_header(path: Path, kind: str, keep_arrays: frozenset = frozenset()) -> dict:
    """An adapter GGUF's header, refused in one line unless it is a kvpot adapter of this kind and format."""
    check_gguf_header(path, what="adapter")
    kv = read_header(path, keep_arrays=keep_arrays)  # one clear line for a truncated or malformed header
    if kv.get("general.type") != "adapter":
        raise AdapterError(f"{path} is not an adapter GGUF (general.type = {kv.get('general.type')!r})")
    if kv.get("adapter.type") != kind:
        raise AdapterError(f"{path} is a {kv.get('adapter.type')!r} adapter, not {kind}")
    if kv.get("kvpot.format_version") != FORMAT_VERSION:
        raise AdapterError(f"{path}: adapter format version {kv.get('kvpot.format_version')!r}, "
                           f"this kvpot reads {FORMAT_VERSION}")
    return kv


def _base_identity(kv: dict) -> BaseIdentity:
    """The base model an adapter was made for, as its header records it (KeyError etc. when incomplete)."""
    return BaseIdentity(arch=str(kv["general.architecture"]),
                        **{n: int(kv[f"kvpot.base.{n}"]) for n in
                           ("n_layer", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_embd")},
                        sha256=str(kv["kvpot.base.sha256"]))


def read_retaining_heads(path: Path, model: Path | None = None) -> RetainingHeads:
    """Read and check an adapter; with `model`, refuse it unless it was made for that model."""
    path = Path(path)
    kv = _adapter_header(path, RETAINING_HEADS)
    try:
        base = _base_identity(kv)
        activation = str(kv["kvpot.retaining_heads.activation"])
        hidden = int(kv["kvpot.retaining_heads.hidden"])
    except (KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{path}: the adapter lacks its base-model identity ({e})") from None
    if model is not None:
        why = base.mismatch(BaseIdentity.of_model(model))
        if why:
            raise AdapterError(f"{path} was made for another model ({why}); train or convert heads for {Path(model).name}")
    tensors = _read_tensors(path)
    heads = RetainingHeads(base=base, activation=activation)
    for il in range(base.n_layer):
        names = _tensor_names(il)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise AdapterError(f"{path}: layer {il} has no {missing[0]}")
        heads.fc1.append(tensors.pop(names[0]))
        heads.fc2.append(tensors.pop(names[1]))
    if tensors:
        raise AdapterError(f"{path}: unexpected tensor {sorted(tensors)[0]} (the model has {base.n_layer} layers)")
    heads.check_shapes()
    if heads.hidden != hidden:
        raise AdapterError(f"{path}: hidden size {heads.hidden} in the tensors, {hidden} in the header")
    return heads


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        return {t.name: _as_f32(t) for t in reader.tensors}
    except AdapterError:
        raise
    except Exception as e:  # gguf-py raises many kinds on a damaged file; all mean the same to a user
        raise AdapterError(f"{path} is a damaged adapter GGUF ({type(e).__name__}: {str(e)[:80]})") from None


# -- EdgeInfinite's memory gate (adapter.type = kvpot.memory_gate) ------------------------------------

MEMORY_GATE = "kvpot.memory_gate"
_GATE_TENSORS = ("mg_w1.weight", "mg_w1.bias", "mg_w2.weight", "mg_w2.bias", "mg_g")


def pot_layer_ids(model: Path) -> list[int]:
    """The model layers whose KV lives in the pot (all but the sliding-window ones), as llama.cpp decides."""
    from kvpot.models.gguf_file import read_model_facts

    facts = read_model_facts(model)
    swa = facts.swa_layers or (False,) * facts.n_layer
    return [il for il, s in enumerate(swa) if not s]


def initial_memory_gate(model: Path, d_h: int | None = None):
    """The untrained gate for a model (kvpot.memory_gate: identity MLP, nearly closed gate)."""
    from kvpot.policies.edgeinfinite_memory import MemoryGate

    base = BaseIdentity.of_model(model)
    return MemoryGate.initial(pot_layer_ids(model), base.head_dim_v, base.n_head, d_h=d_h, base=base)


def write_memory_gate(path: Path, gate, source: str = "") -> None:
    """Write EdgeInfinite's memory-gating module (kvpot.policies.edgeinfinite_memory.MemoryGate with .base) as an adapter GGUF."""
    import gguf

    gate.check_shapes()
    b = gate.base
    w = gguf.GGUFWriter(str(path), arch=b.arch)
    w.add_type("adapter")
    w.add_string("adapter.type", MEMORY_GATE)
    w.add_uint32("kvpot.format_version", FORMAT_VERSION)
    for name in ("n_layer", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_embd"):
        w.add_uint32(f"kvpot.base.{name}", int(getattr(b, name)))
    w.add_string("kvpot.base.sha256", b.sha256)
    w.add_array("kvpot.memory_gate.layers", [int(i) for i in gate.layers])
    w.add_uint32("kvpot.memory_gate.hidden", gate.d_h)
    w.add_string("kvpot.memory_gate.sigma", "elu+1")
    w.add_string("kvpot.memory_gate.query", "the layer's attention queries after RoPE and any q norm, in the "
                                            "unscaled convention (q * kq_scale * sqrt(d_k)); keys and values as cached")
    if source:
        w.add_string("kvpot.source", source)
    for i, il in enumerate(gate.layers):
        for name, arr in zip(_GATE_TENSORS, (gate.w1[i], gate.b1[i], gate.w2[i], gate.b2[i], gate.g[i])):
            w.add_tensor(f"blk.{il}.{name}", np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_memory_gate(path: Path, model: Path | None = None):
    """Read and check a memory-gate adapter; with `model`, refuse it unless it was made for that model."""
    from kvpot.policies.edgeinfinite_memory import MemoryGate

    path = Path(path)
    kv = _adapter_header(path, MEMORY_GATE, keep_arrays=frozenset({"kvpot.memory_gate.layers"}))
    try:
        base = _base_identity(kv)
        layers = [int(i) for i in kv["kvpot.memory_gate.layers"]]
        hidden = int(kv["kvpot.memory_gate.hidden"])
    except (KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{path}: the adapter lacks its base-model identity ({e})") from None
    if model is not None:
        why = base.mismatch(BaseIdentity.of_model(model))
        if not why and layers != pot_layer_ids(model):
            why = f"layers {layers} (adapter) vs {pot_layer_ids(model)} (model)"
        if why:
            raise AdapterError(f"{path} was made for another model ({why}); train a gate for {Path(model).name}")
    tensors = _read_tensors(path)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in _GATE_TENSORS}
    for il in layers:
        for n in _GATE_TENSORS:
            t = tensors.pop(f"blk.{il}.{n}", None)
            if t is None:
                raise AdapterError(f"{path}: layer {il} has no {n}")
            parts[n].append(t)
    if tensors:
        raise AdapterError(f"{path}: unexpected tensor {sorted(tensors)[0]}")
    try:
        gate = MemoryGate(layers=layers, w1=np.stack(parts["mg_w1.weight"]), b1=np.stack(parts["mg_w1.bias"]),
                          w2=np.stack(parts["mg_w2.weight"]), b2=np.stack(parts["mg_w2.bias"]),
                          g=np.stack(parts["mg_g"]), base=base)
        gate.check_shapes()
    except (KvpotError, ValueError) as e:
        raise AdapterError(f"{path}: {e}") from None
    if gate.d_h != hidden or gate.d_v != base.head_dim_v or gate.n_head != base.n_head:
        raise AdapterError(f"{path}: gate shapes do not fit the identity (hidden {hidden}, head dim "
                           f"{base.head_dim_v}, {base.n_head} heads)")
    return gate
