"""A model of a real model's shape with seeded random weights, for measuring speed where the real file
cannot go (the GPU machine takes 64 MiB of files; the 1.5B Qwen model is 1.1 GB).

    python tests/synthetic_model.py skeleton REAL.gguf SKELETON.gguf
        every metadata key of REAL (architecture, tokenizer, chat template) and the list of its
        tensors' names and shapes, without the tensors: a few MB
    python tests/synthetic_model.py fill SKELETON.gguf OUT.gguf [--seed N]
        the model: matrices F16 drawn from N(0, 0.02²), norm weights 1, biases 0

Reading speed does not depend on the weights' values, only on their shapes and types, so the synthetic
model reads at the real one's speed for F16 weights (a real Q4_K_M file's products are other kernels).
Its answers are noise. Only the gguf package and numpy are needed (both travel to the GPU machine)."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

TENSORS_KEY = "kvpot.synthetic.tensors"  # JSON: [[name, [ne0, ne1, ...]], ...]
FILE_TYPE_F16 = 1  # llama_ftype MOSTLY_F16


def _copy_fields(reader: GGUFReader, writer: GGUFWriter, skip: set[str]) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def skeleton(real: str, out: str) -> None:
    r = GGUFReader(real)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(out, arch)
    _copy_fields(r, w, skip={"general.file_type", "general.quantization_version"})
    w.add_file_type(FILE_TYPE_F16)
    w.add_string(TENSORS_KEY, json.dumps([[t.name, [int(x) for x in t.shape]] for t in r.tensors]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def fill(skel: str, out: str, seed: int) -> None:
    r = GGUFReader(skel)
    arch = r.fields["general.architecture"].contents()
    tensors = json.loads(r.fields[TENSORS_KEY].contents())
    w = GGUFWriter(out, arch)
    _copy_fields(r, w, skip={TENSORS_KEY})
    rng = np.random.default_rng(seed)
    for name, shape in tensors:
        dims = tuple(reversed(shape))  # numpy's order is ggml's reversed
        if name.endswith("norm.weight"):
            data = np.ones(dims, np.float32)
        elif name.endswith(".bias"):
            data = np.zeros(dims, np.float32)
        elif len(dims) == 1:
            data = (0.02 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float32)
        else:
            data = (0.02 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float16)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton")
    s.add_argument("real")
    s.add_argument("out")
    f = sub.add_parser("fill")
    f.add_argument("skeleton")
    f.add_argument("out")
    f.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.cmd == "skeleton":
        skeleton(a.real, a.out)
    else:
        fill(a.skeleton, a.out, a.seed)


if __name__ == "__main__":
    main(sys.argv[1:])
