"""Turn what the user passed as --model (a known name or a path) into a checked GGUF file."""

from __future__ import annotations

from pathlib import Path

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import ModelFacts, read_model_facts
from kvpot.models.pull import HF_SPEC, cached_path, hf_cached_path
from kvpot.models.registry import KNOWN, KnownModel


def resolve_model(spec: str) -> tuple[ModelFacts, KnownModel | None]:
    known = KNOWN.get(spec)
    if known is not None:
        path = cached_path(known)
        if not path.is_file():
            raise KvpotError(f"model {spec} is not downloaded yet; run `kvpot pull {spec}`")
        return read_model_facts(path), known
    if spec.startswith("hf:"):  # pulled into the models dir by `kvpot pull hf:...`
        if not HF_SPEC.match(spec):
            raise KvpotError(f"{spec}: expected hf:OWNER/REPO/FILE.gguf")
        path = hf_cached_path(spec)
        if not path.is_file():
            raise KvpotError(f"model {spec} is not downloaded yet; run `kvpot pull {spec}`")
        return read_model_facts(path), None
    if not spec.strip():
        raise KvpotError("--model is empty: pass a known model name or a path to a .gguf file")
    path = Path(spec).expanduser()
    if not path.exists() and path.suffix != ".gguf" and "/" not in spec:
        raise KvpotError(f"unknown model {spec!r}: not a known name ({', '.join(KNOWN)}) and no such file")
    return read_model_facts(path), None
