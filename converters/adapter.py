"""kvpot adapter GGUF files: trained parts that run beside a base model. The one home of their
in-memory types (BaseIdentity, RetainingHeads for Locret, MemoryGate for EdgeInfinite), of the header
every adapter carries (`adapter_header`), and of their writers and readers.

Imports go one way: policies, training and the CLI import this module; it imports nothing from
kvpot.policies (tests/test_adapter_imports.py checks it). An adapter carries the identity of the base
model it was made for, and is checked against the model in Python, with one clear line per problem,
before any of it reaches C code. Format: docs/formats.md, "Adapters".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import check_gguf_header, read_header, read_model_facts
from kvpot.models.model_hash import model_sha256
from kvpot.safe_write import atomic_write, resolve_target

FORMAT_VERSION = 1
RETAINING_HEADS = "kvpot.retaining_heads"
MEMORY_GATE = "kvpot.memory_gate"
_DIMS = ("n_layer", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_embd")
# far above any model's layers, heads or widths: a header value past it is damage, and products of
# two such values stay within what NumPy indexes
_MAX_DIM = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
# EdgeInfinite's untrained gate (MemoryGate): b1 = +INIT_OFFSET, b2 = -INIT_OFFSET, g = INIT_G
INIT_OFFSET = 8.0
INIT_G = -4.0

# the model's hidden_act, which Locret's retaining heads use (section 3; fc2(act(fc1(x)))), by GGUF architecture
ACTIVATIONS = {"llama": "silu", "mistral": "silu", "qwen2": "silu", "qwen3": "silu", "phi3": "silu",
               "gemma": "gelu", "gemma2": "gelu", "gemma3": "gelu"}


class AdapterError(KvpotError):
    """An adapter file that cannot be used with this model (or at all)."""


# -- the types ----------------------------------------------------------------------------------------

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
        for name in ("arch", *_DIMS, "sha256"):
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


@dataclass
class MemoryGate:
    """EdgeInfinite's memory-gating module, the trained part, per pot layer (model layer ids in `layers`);
    `mix` is its NumPy reference (kvpot/policies/edgeinfinite_memory.py holds the memory's).

        gate:  A~ = W2 ReLU(W1 A_mem + b1) + b2                  (paper eq. 8)
               A_com = sigmoid(g) A~ + (1 - sigmoid(g)) A_dot    (eq. 9), then W_o as usual

    Shapes (decisions; the paper gives none, only "about 0.15 % of the weights" for its 3B model):
      * W1 [d_h, d_v], b1 [d_h], W2 [d_v, d_h], b2 [d_v]: one MLP per layer, shared by the layer's query
        heads, acting on each head's d_v-vector (the paper's eq. 8 is written per head, A_mem in R^{L x d});
        d_h = d_v by default.
      * g [n_head, d_v]: per query head and channel (the paper calls g "a gating vector"; per channel is the
        Infini-attention choice, per head keeps heads that use the memory apart from those that do not).
      Per layer that is 2 d_v^2 + d_h + d_v + n_head d_v weights. SmolLM2-135M (30 layers, d = 64, 9 heads):
      30 x 8 896 = 266 880 weights, 0.20 % of its 134.5M. Gemma-3-270M's 3 global (pot) layers (d = 256,
      4 heads): 3 x 132 608 = 397 824, 0.15 % of 268M. A per-head MLP would be 9x (SmolLM2: 1.8 %) and a
      full-width one (n_head d_v)^2 far more; a shared d x d MLP is what lands near the paper's figure.
    Initial values (the "untrained gate" ablation is exactly this): W1 = W2 = I, b1 = +c, b2 = -c with
      c = INIT_OFFSET, so A~ = A_mem while every A_mem channel is above -c (A_mem is a convex combination
      of cached values, so that holds unless a value channel reaches -c); g = INIT_G = -4, sigmoid(g) = 0.018:
      the untrained layer is within 2 % of the stock attention output, and training opens the gate where
      the memory helps (a frozen backbone cannot absorb the paper's Infini-attention start at g = 0, which
      halves every attention output).
    """

    layers: list[int]
    w1: np.ndarray  # [L, d_h, d_v]
    b1: np.ndarray  # [L, d_h]
    w2: np.ndarray  # [L, d_v, d_h]
    b2: np.ndarray  # [L, d_v]
    g: np.ndarray   # [L, n_head, d_v]
    base: BaseIdentity | None = field(default=None, compare=False)  # needed to write it as an adapter

    @classmethod
    def initial(cls, layers: list[int], d_v: int, n_head: int, d_h: int | None = None,
                base: BaseIdentity | None = None) -> MemoryGate:
        d_h = d_v if d_h is None else d_h
        L = len(layers)
        eye = np.eye(d_h, d_v, dtype=np.float32)
        return cls(layers=list(layers), w1=np.tile(eye, (L, 1, 1)), b1=np.full((L, d_h), INIT_OFFSET, np.float32),
                   w2=np.tile(eye.T, (L, 1, 1)), b2=np.full((L, d_v), -INIT_OFFSET, np.float32),
                   g=np.full((L, n_head, d_v), INIT_G, np.float32), base=base)

    @property
    def d_v(self) -> int:
        return int(self.w1.shape[2])

    @property
    def d_h(self) -> int:
        return int(self.w1.shape[1])

    @property
    def n_head(self) -> int:
        return int(self.g.shape[1])

    def check_shapes(self) -> None:
        L, d_h, d_v = self.w1.shape
        want = {"w1": (L, d_h, d_v), "b1": (L, d_h), "w2": (L, d_v, d_h), "b2": (L, d_v), "g": (L, self.n_head, d_v)}
        if len(self.layers) != L:
            raise AdapterError(f"memory gate: {len(self.layers)} layer ids for {L} layers of weights")
        for name, shape in want.items():
            a = getattr(self, name)
            if a.shape != shape:
                raise AdapterError(f"memory gate: {name} is {list(a.shape)}, expected {list(shape)}")
            if not np.isfinite(a).all():
                raise AdapterError(f"memory gate: {name} holds NaN or infinite weights")

    def mix(self, layer: int, a_mem: np.ndarray, a_dot: np.ndarray) -> np.ndarray:
        """A_com [n_tokens, n_head, d_v] for pot layer `layer` (index into `layers`), in float64."""
        w1, b1, w2, b2 = (a[layer].astype(np.float64) for a in (self.w1, self.b1, self.w2, self.b2))
        h = np.maximum(a_mem @ w1.T + b1, 0.0)
        a_tl = h @ w2.T + b2
        sg = 1.0 / (1.0 + np.exp(-self.g[layer].astype(np.float64)))  # [n_head, d_v]
        return sg * a_tl + (1.0 - sg) * np.asarray(a_dot, dtype=np.float64)


# -- the header every adapter carries -----------------------------------------------------------------

def adapter_header(kind: str, base: BaseIdentity, own: list[tuple[str, str, object]],
                   source: str = "") -> list[tuple[str, str, object]]:
    """The key/values of an adapter of type `kind`, in the order every writer puts them: the adapter
    type and format, the base model's identity, the type's own fields, then `source` (what made it) if
    given. (kind, key, value) triples as `_write_adapter` takes them."""
    fields: list[tuple[str, str, object]] = [("type", "general.type", "adapter"), ("string", "adapter.type", kind),
                                             ("uint32", "kvpot.format_version", FORMAT_VERSION)]
    fields += [("uint32", f"kvpot.base.{name}", int(getattr(base, name))) for name in _DIMS]
    fields += [("string", "kvpot.base.sha256", base.sha256), *own]
    if source:
        fields.append(("string", "kvpot.source", source))
    return fields


# -- writing ------------------------------------------------------------------------------------------

def check_adapter_output(out: Path | str, option: str = "--output", inputs: tuple = ()) -> Path:
    """Where an adapter will be written, checked before any work: a .gguf name, new or a regular
    writable file, in an existing writable folder, and none of the files the command reads (writing
    over the base model would replace it). Returns the path the bytes will land at."""
    out = Path(out).expanduser()
    if out.suffix != ".gguf":
        raise AdapterError(f"{option} {out}: expected a .gguf file name")
    target = resolve_target(out, "adapter")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise AdapterError(f"{option} {out}: the file exists and is not writable")
        for src in inputs:
            if src is not None and _same_file(target, Path(src)):
                raise AdapterError(f"{option} {out} is {src}, which this command reads; name a new file")
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _write_adapter(path: Path, arch: str, fields: list[tuple[str, str, object]],
                   tensors: list[tuple[str, np.ndarray, object]]) -> None:
    """Write an adapter GGUF atomically (kvpot.safe_write): a failed or interrupted write leaves the
    target as it was. fields: (kind, key, value) with kind a GGUFWriter adder (uint32, string, array,
    type); tensors: (name, array, raw GGML type or None)."""
    import gguf

    w = gguf.GGUFWriter(None, arch=arch)
    for kind, key, value in fields:
        if kind == "type":
            w.add_type(value)
        else:
            getattr(w, f"add_{kind}")(key, value)
    for name, arr, raw_dtype in tensors:
        if raw_dtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=raw_dtype)
    with atomic_write(path, "adapter") as f:
        # the writer opens the temporary file by name; atomic_write renames it once complete
        try:
            w.write_header_to_file(path=Path(f.name))
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        except ValueError as e:  # gguf-py's check of a short write
            raise AdapterError(f"cannot save the adapter to {path}: {e}") from None
        finally:
            w.close()


def retaining_heads_contents(heads: RetainingHeads, dtype: str = "f32", source: str = "") -> tuple[list, list]:
    """The key/values and tensors of a retaining-heads adapter (what write_retaining_heads writes)."""
    import gguf

    heads.check_shapes()
    fields = adapter_header(RETAINING_HEADS, heads.base, [
        ("uint32", "kvpot.retaining_heads.hidden", heads.hidden),
        ("string", "kvpot.retaining_heads.activation", heads.activation),
        ("string", "kvpot.retaining_heads.input", "q,k,v: the layer's attn_q, attn_k, attn_v of its normed input, "
                                                  "before RoPE (and before any q/k norm)")], source)
    tensors = []
    for il in range(heads.base.n_layer):
        for name, arr in zip(_tensor_names(il), (heads.fc1[il], heads.fc2[il])):
            tensors.append(_tensor(gguf, name, np.asarray(arr, dtype=np.float32), dtype))
    return fields, tensors


def write_retaining_heads(path: Path, heads: RetainingHeads, dtype: str = "f32", source: str = "") -> None:
    """Write an adapter GGUF. dtype: f32, f16, or bf16 (exact for heads published in bf16)."""
    fields, tensors = retaining_heads_contents(heads, dtype, source)
    _write_adapter(path, heads.base.arch, fields, tensors)


def _tensor(gguf, name: str, arr: np.ndarray, dtype: str) -> tuple[str, np.ndarray, object]:
    if dtype == "f32":
        return name, arr, None
    if dtype == "f16":
        return name, arr.astype(np.float16), None
    if dtype == "bf16":
        bits = arr.view(np.uint32)
        if np.any(bits & 0xFFFF):
            raise AdapterError(f"{name} is not exactly representable in bf16; write it as f32")
        return name, (bits >> 16).astype(np.uint16), gguf.GGMLQuantizationType.BF16
    raise ValueError(f"dtype {dtype!r}")


# -- reading --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelTarget:
    """What an adapter is checked against: the base model's identity and the layers its pot holds,
    read once from the model's header (a path given to a reader is turned into one)."""

    base: BaseIdentity
    pot_layers: tuple[int, ...]
    name: str

    @classmethod
    def of(cls, model: Path | str | ModelTarget) -> ModelTarget:
        if isinstance(model, ModelTarget):
            return model
        path = Path(model)
        return cls(base=BaseIdentity.of_model(path), pot_layers=tuple(pot_layer_ids(path)), name=path.name)


def _read_adapter_header(path: Path, kind: str, keep_arrays: frozenset = frozenset()) -> dict:
    """An adapter GGUF's header, refused in one line unless it is a kvpot adapter of this kind and format."""
    try:
        check_gguf_header(path, what="adapter")
        kv = read_header(path, keep_arrays=keep_arrays)  # one clear line for a truncated or malformed header
    except AdapterError:
        raise
    except KvpotError as e:
        raise AdapterError(str(e)) from None
    if kv.get("general.type") != "adapter":
        raise AdapterError(f"{path} is not an adapter GGUF (general.type = {_shown(kv.get('general.type'))})")
    if kv.get("adapter.type") != kind:
        raise AdapterError(f"{path} is a {_shown(kv.get('adapter.type'))} adapter, not {kind}")
    if kv.get("kvpot.format_version") != FORMAT_VERSION or isinstance(kv.get("kvpot.format_version"), bool):
        raise AdapterError(f"{path}: adapter format version {_shown(kv.get('kvpot.format_version'))}, "
                           f"this kvpot reads {FORMAT_VERSION}")
    return kv


def _shown(value) -> str:
    """A header value in an error line, cut short (a damaged string may be long or hold newlines)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _header_int(kv: dict, key: str, path: Path, least: int = 1) -> int:
    """A whole-number header field in [least, _MAX_DIM], or one line naming it."""
    if key not in kv:
        raise AdapterError(f"{path}: the adapter lacks {key} (its base-model identity is incomplete)")
    v = kv[key]
    if not isinstance(v, int) or isinstance(v, bool) or not least <= v <= _MAX_DIM:
        raise AdapterError(f"{path}: {key} is {_shown(v)}, expected a whole number from {least} to {_MAX_DIM}")
    return v


def _header_str(kv: dict, key: str, path: Path, allowed=None) -> str:
    v = kv.get(key)
    if not isinstance(v, str) or not v or (allowed is not None and v not in allowed):
        want = " or ".join(allowed) if allowed else "a non-empty string"
        raise AdapterError(f"{path}: {key} is {_shown(v)}, expected {want}")
    return v


def _base_identity(kv: dict, path: Path) -> BaseIdentity:
    """The base model an adapter was made for, as its header records it, every field checked."""
    base = BaseIdentity(arch=_header_str(kv, "general.architecture", path),
                        **{n: _header_int(kv, f"kvpot.base.{n}", path) for n in _DIMS},
                        sha256=_header_str(kv, "kvpot.base.sha256", path))
    if not _SHA256.fullmatch(base.sha256):
        raise AdapterError(f"{path}: kvpot.base.sha256 is {_shown(base.sha256)}, not a SHA-256 in hex")
    if base.n_head % base.n_head_kv:
        raise AdapterError(f"{path}: {base.n_head} query heads do not share {base.n_head_kv} KV heads evenly")
    return base


def _check_for_model(path: Path, base: BaseIdentity, target: ModelTarget, what: str) -> None:
    why = base.mismatch(target.base)
    if why:
        raise AdapterError(f"{path} was made for another model ({why}); {what} for {target.name}")


def _read_tensors(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The adapter's tensors as float32, each checked by its declared name, shape and type, and the
    data regions checked not to overlap, before any is converted: memory stays within the file's size."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        infos = list(reader.tensors)
    except Exception as e:  # gguf-py raises many kinds on a damaged file; all mean the same to a user
        raise AdapterError(f"{path} is a damaged adapter GGUF ({type(e).__name__}: {str(e)[:80]})") from None
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    names = [t.name for t in infos]
    for name in sorted(expected):
        if name not in names:
            raise AdapterError(f"{path}: the adapter has no tensor {name}")
    extra = sorted(set(names) - set(expected))
    if extra:
        raise AdapterError(f"{path}: unexpected tensor {_shown(extra[0])} (not one this adapter type holds)")
    if len(names) != len(set(names)):
        raise AdapterError(f"{path}: a tensor name appears twice")
    for t in infos:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists ne[0] first
        if shape != expected[t.name]:
            raise AdapterError(f"{path}: tensor {t.name} is {list(shape)}, expected {list(expected[t.name])} "
                               "(is the adapter for this model?)")
        if t.tensor_type not in floats:
            raise AdapterError(f"{path}: tensor {t.name} has type {t.tensor_type.name}; adapters hold f32, f16 or bf16")
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in infos)
    if any(end > nxt for (_, end), (nxt, _) in zip(spans, spans[1:])):
        raise AdapterError(f"{path}: the data of two tensors overlap (a damaged adapter GGUF)")
    try:
        return {t.name: _as_f32(t, expected[t.name]) for t in infos}
    except Exception as e:
        raise AdapterError(f"{path} is a damaged adapter GGUF ({type(e).__name__}: {str(e)[:80]})") from None


def _as_f32(t, shape: tuple[int, ...]) -> np.ndarray:
    import gguf

    data = np.asarray(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        out = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        out = data.astype(np.float32)
    return out.reshape(shape)


def read_retaining_heads(path: Path, model: Path | ModelTarget | None = None) -> RetainingHeads:
    """Read and check an adapter; with `model`, refuse it unless it was made for that model."""
    path = Path(path)
    kv = _read_adapter_header(path, RETAINING_HEADS)
    base = _base_identity(kv, path)
    activation = _header_str(kv, "kvpot.retaining_heads.activation", path, allowed=("silu", "gelu"))
    hidden = _header_int(kv, "kvpot.retaining_heads.hidden", path)
    if model is not None:
        _check_for_model(path, base, ModelTarget.of(model), "train or convert heads")
    expected = {}
    for il in range(base.n_layer):
        fc1, fc2 = _tensor_names(il)
        expected[fc1], expected[fc2] = (hidden, base.qkv_width()), (base.n_head_kv, hidden)
    tensors = _read_tensors(path, expected)
    heads = RetainingHeads(base=base, activation=activation)
    for il in range(base.n_layer):
        fc1, fc2 = _tensor_names(il)
        heads.fc1.append(tensors[fc1])
        heads.fc2.append(tensors[fc2])
    try:
        heads.check_shapes()
    except AdapterError as e:
        raise AdapterError(f"{path}: {e}") from None
    return heads


# -- EdgeInfinite's memory gate (adapter.type = kvpot.memory_gate) ------------------------------------

_GATE_TENSORS = ("mg_w1.weight", "mg_w1.bias", "mg_w2.weight", "mg_w2.bias", "mg_g")


def pot_layer_ids(model: Path) -> list[int]:
    """The model layers whose KV lives in the pot (all but the sliding-window ones), as llama.cpp decides."""
    facts = read_model_facts(model)
    swa = facts.swa_layers or (False,) * facts.n_layer
    return [il for il, s in enumerate(swa) if not s]


def initial_memory_gate(model: Path, d_h: int | None = None) -> MemoryGate:
    """The untrained gate for a model (MemoryGate.initial: identity MLP, nearly closed gate)."""
    base = BaseIdentity.of_model(model)
    return MemoryGate.initial(pot_layer_ids(model), base.head_dim_v, base.n_head, d_h=d_h, base=base)


def memory_gate_contents(gate: MemoryGate, source: str = "") -> tuple[list, list]:
    """The key/values and tensors of a memory-gate adapter (what write_memory_gate writes)."""
    gate.check_shapes()
    fields = adapter_header(MEMORY_GATE, gate.base, [
        ("array", "kvpot.memory_gate.layers", [int(i) for i in gate.layers]),
        ("uint32", "kvpot.memory_gate.hidden", gate.d_h),
        ("string", "kvpot.memory_gate.sigma", "elu+1"),
        ("string", "kvpot.memory_gate.query", "the layer's attention queries after RoPE and any q norm, in the "
                                              "unscaled convention (q * kq_scale * sqrt(d_k)); keys and values as cached")],
        source)
    tensors = [(f"blk.{il}.{name}", np.ascontiguousarray(arr, dtype=np.float32), None)
               for i, il in enumerate(gate.layers)
               for name, arr in zip(_GATE_TENSORS, (gate.w1[i], gate.b1[i], gate.w2[i], gate.b2[i], gate.g[i]))]
    return fields, tensors


def write_memory_gate(path: Path, gate: MemoryGate, source: str = "") -> None:
    """Write EdgeInfinite's memory-gating module (with its .base) as an adapter GGUF."""
    fields, tensors = memory_gate_contents(gate, source)
    _write_adapter(path, gate.base.arch, fields, tensors)


def _gate_layers(kv: dict, path: Path, n_layer: int) -> list[int]:
    """The gate's layer ids: model layers in increasing order, at least one."""
    key = "kvpot.memory_gate.layers"
    v = kv.get(key)
    if (not isinstance(v, list) or not v or any(not isinstance(i, int) or isinstance(i, bool) for i in v)
            or any(not 0 <= i < n_layer for i in v) or any(a >= b for a, b in zip(v, v[1:]))):
        raise AdapterError(f"{path}: {key} is {_shown(v)}, expected increasing layer ids below {n_layer}")
    return v


def read_memory_gate(path: Path, model: Path | ModelTarget | None = None) -> MemoryGate:
    """Read and check a memory-gate adapter; with `model`, refuse it unless it was made for that model."""
    path = Path(path)
    kv = _read_adapter_header(path, MEMORY_GATE, keep_arrays=frozenset({"kvpot.memory_gate.layers"}))
    base = _base_identity(kv, path)
    layers = _gate_layers(kv, path, base.n_layer)
    hidden = _header_int(kv, "kvpot.memory_gate.hidden", path)
    if model is not None:
        target = ModelTarget.of(model)
        _check_for_model(path, base, target, "train a gate")
        if layers != list(target.pot_layers):
            raise AdapterError(f"{path} was made for another model (layers {_shown(layers)} (adapter) vs "
                               f"{_shown(list(target.pot_layers))} (model)); train a gate for {target.name}")
    d_v = base.head_dim_v
    shapes = {"mg_w1.weight": (hidden, d_v), "mg_w1.bias": (hidden,), "mg_w2.weight": (d_v, hidden),
              "mg_w2.bias": (d_v,), "mg_g": (base.n_head, d_v)}
    tensors = _read_tensors(path, {f"blk.{il}.{n}": shape for il in layers for n, shape in shapes.items()})
    parts = {n: np.stack([tensors[f"blk.{il}.{n}"] for il in layers]) for n in _GATE_TENSORS}
    gate = MemoryGate(layers=layers, w1=parts["mg_w1.weight"], b1=parts["mg_w1.bias"], w2=parts["mg_w2.weight"],
                      b2=parts["mg_w2.bias"], g=parts["mg_g"], base=base)
    try:
        gate.check_shapes()
    except AdapterError as e:
        raise AdapterError(f"{path}: {e}") from None
    return gate
