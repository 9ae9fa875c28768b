"""Stock as users run it: unpatched llama.cpp of the runtime's commit reading a document at its defaults.
The reference every speed and memory ratio is taken against (`kvpot bench throughput`).

What runs: the libllama of kvpot.build.upstream (the verified sdist's llama.cpp, no patch applied),
loaded with llama_model_default_params() (load mode auto: the file memory-mapped on a CPU) and a
context from llama_context_default_params() (flash attention auto, which llama.cpp turns on wherever
the backend runs it, a CPU included; swa_full, n_ubatch 512) with only what a reader of one document
must set changed: n_ctx large enough for the document and its answer, n_threads (and n_threads_batch)
equal to kvpot's, n_batch equal to kvpot's chunk. The document is decoded in n_batch steps through
llama_batch_get_one (llama.cpp places the positions itself, the last row's logits only), then, where
asked, a question and a few greedy tokens one at a time. Its prefill tokens/s and the process's peak
resident memory (VmHWM, mapped weights included), and RssAnon/RssFile at the end of the read (the
memory without and with the file-backed pages), are the figures.

How: ctypes against upstream's public API, through the llama-cpp-python bindings of the same sdist
(its llama_cpp/ package from the pristine tree, never the installed kvpot wheel), with
LLAMA_CPP_LIB_PATH pointing them at the unpatched library. Those bindings are written for exactly this
llama.h, so the struct layouts (llama_context_params has ~40 fields) come with the header's own commit
rather than from a copy kept in kvpot; an upstream tool would need llama.cpp's common library and tools
built (a far longer build) and starts from common_params' defaults (n_ctx 4096, n_batch 2048), not
llama.h's, and could not hand back the greedy next token that tests/test_stock_upstream.py compares.

It runs in its own process (`python -m kvpot.bench.stock_upstream`, started by `measure`): the patched
library is never loaded beside it (kvpot's runtime refuses a library without its ABI; here the child
checks the reverse, that libllama has no kvpot_* symbol and that every libllama/libggml it maps lies in
the unpatched build's folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kvpot.errors import KvpotError

# the question asked after the read when decode is measured (as kvpot.bench.throughput asks it)
DEFAULT_QUESTION = "\n\nQuestion: On which day did Hilde take soundings?\nAnswer:"


def bindings_root() -> Path:
    """The pristine sdist's root, which holds llama-cpp-python's unpatched llama_cpp/ package."""
    from kvpot import paths
    from kvpot.build.pins import SDIST_SHA256, SDIST_VERSION

    return paths.build_dir() / f"pristine-{SDIST_SHA256[:12]}" / f"llama_cpp_python-{SDIST_VERSION}"


def measure(build, model_path: str, *, tokens: list[int] | None = None, generated: int = 0, n_ctx: int,
            chunk: int, threads: int, decode: int = 0, question: str = DEFAULT_QUESTION) -> dict:
    """Run one read in a child process and return its figures (a dict, the child's JSON).

    build: a kvpot.build.upstream.UpstreamBuild. The document is `tokens`, or `generated` tokens of
    kvpot.bench.logbook's generated text (BOS first where the model adds one), tokenized by the child."""
    job = {"model": str(model_path), "tokens": tokens, "generated": generated, "n_ctx": n_ctx, "chunk": chunk,
           "threads": threads, "decode": decode, "question": question, "lib_dir": build.lib_dir,
           "bindings": str(bindings_root())}
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=build.lib_dir)
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "kvpot.bench.stock_upstream"]
    res = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True, env=env)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvpotError(f"unpatched llama.cpp's read failed (exit {res.returncode}): {last}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return out | {"build": build.identity()}


# ---- the child ------------------------------------------------------------------------------------------

def memory_status() -> dict:
    """VmHWM, VmRSS, RssAnon, RssFile of this process in MiB (/proc/self/status); {} where there is none."""
    want = {"VmHWM": "peak_rss_mb", "VmRSS": "rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb",
            "RssShmem": "rss_shmem_mb"}
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in want:
                    out[want[key]] = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _mapped_libraries() -> list[str]:
    """Every libllama/libggml file this process maps (/proc/self/maps)."""
    found: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
                if os.path.basename(path).startswith(("libllama", "libggml")):
                    found.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(found)


class _Model:
    """Upstream's model through the raw bindings: what kvpot.bench.logbook and the greedy loop need."""

    def __init__(self, L, path: str):
        self.L = L
        self.params = L.llama_model_default_params()
        self.ptr = L.llama_model_load_from_file(path.encode(), self.params)
        if not self.ptr:
            raise KvpotError(f"unpatched llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self.L.llama_token * n_max)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_bos, False)
        if n < 0:
            buf = (self.L.llama_token * -n)()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, -n, add_bos, False)
        return list(buf[:n])

    def is_eog(self, tok: int) -> bool:
        return bool(self.L.llama_vocab_is_eog(self.vocab, tok))


def _decode(L, ctx, toks: list[int], chunk: int) -> None:
    for s in range(0, len(toks), chunk):
        part = toks[s:s + chunk]
        arr = (L.llama_token * len(part))(*part)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(part)))
        if rc != 0:
            raise KvpotError(f"unpatched llama_decode failed ({rc}) at token {s}")


def _logits(L, ctx, n_vocab: int):
    import numpy as np

    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()


def child(job: dict) -> dict:
    import ctypes

    import numpy as np

    sys.path.insert(0, job["bindings"])
    import llama_cpp.llama_cpp as L

    bindings = Path(L.__file__).resolve()
    if not bindings.is_relative_to(Path(job["bindings"]).resolve()):
        raise KvpotError(f"llama_cpp was imported from {bindings}, not from the pristine sdist {job['bindings']}")
    if hasattr(L._lib, "kvpot_abi_version"):
        raise KvpotError(f"{L._lib._name} is kvpot's patched library, not the unpatched build")
    log: list[str] = []

    @L.llama_log_callback
    def keep(level, text, user_data):  # llama.cpp's log: kept for the lines that say what it chose
        log.append(text.decode("utf-8", "replace"))

    L.llama_log_set(keep, ctypes.c_void_p(0))
    L.llama_backend_init()
    model = _Model(L, job["model"])
    if job.get("tokens") is not None:
        tokens = [int(t) for t in job["tokens"]]
    else:
        from kvpot.bench.logbook import generated_tokens

        bos = model.tokenize("", add_bos=True)
        tokens = bos + generated_tokens(model, job["generated"] - len(bos))
    question = model.tokenize(job["question"]) if job["decode"] else []
    cp = L.llama_context_default_params()
    defaults = {"n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch, "n_threads": cp.n_threads,
                "flash_attn_type": L.llama_flash_attn_type_name(cp.flash_attn_type).decode(), "swa_full": cp.swa_full,
                "load_mode": model.params.load_mode, "use_extra_bufts": model.params.use_extra_bufts}
    cp.n_ctx = job["n_ctx"]
    cp.n_batch = job["chunk"]
    cp.n_threads = cp.n_threads_batch = job["threads"]
    ctx = L.llama_init_from_model(model.ptr, cp)
    if not ctx:
        raise KvpotError(f"unpatched llama.cpp could not create a context of {job['n_ctx']} cells")
    chunk = min(job["chunk"], L.llama_n_batch(ctx))
    t0 = time.perf_counter()
    _decode(L, ctx, tokens, chunk)
    logits = _logits(L, ctx, model.n_vocab)
    dt = time.perf_counter() - t0
    mem = memory_status()
    res = {"mode": "upstream", "tokens": len(tokens), "seconds": dt, "tok_s": len(tokens) / dt,
           "next_token": int(np.argmax(logits)), "peak_rss_mb": mem.get("peak_rss_mb"),
           **{f"end_{k}": mem[k] for k in ("rss_mb", "rss_anon_mb", "rss_file_mb") if k in mem},
           "params": {"n_ctx": L.llama_n_ctx(ctx), "n_batch": L.llama_n_batch(ctx), "n_ubatch": L.llama_n_ubatch(ctx),
                      "n_threads": job["threads"], "flash_attn_type": defaults["flash_attn_type"]},
           "defaults": defaults,
           # what llama.cpp chose: flash attention (auto resolved), the load mode, weights repacked or not
           "log": [ln.strip() for ln in log if any(w in ln.lower() for w in ("flash", "load_mode", "repack"))
                   and "used by node" not in ln],
           "flash_attn_enabled": any("flash attention enabled" in ln.lower() for ln in log),
           "libraries": _mapped_libraries(), "bindings": str(bindings.parent)}
    lib_dir = Path(job["lib_dir"]).resolve()
    stray = [p for p in res["libraries"] if not Path(p).is_relative_to(lib_dir)]
    if stray:
        raise KvpotError(f"the unpatched read mapped libraries from elsewhere: {', '.join(stray)}")
    if job["decode"]:
        res |= _greedy(L, ctx, model, question, job["decode"], chunk)
    return res


def _greedy(L, ctx, model: _Model, question: list[int], n: int, chunk: int) -> dict:
    """The question, then n greedy tokens each decoded alone; an end-of-generation token is never chosen
    (the next most likely is), as kvpot.bench.throughput times its sides."""
    import numpy as np

    t0 = time.perf_counter()
    _decode(L, ctx, question, chunk)
    logits = _logits(L, ctx, model.n_vocab)
    tq = time.perf_counter() - t0
    masked = 0
    t0 = time.perf_counter()
    for _ in range(n):
        while model.is_eog(tok := int(np.argmax(logits))):
            masked += 1
            logits[tok] = -np.inf
        _decode(L, ctx, [tok], 1)
        logits = _logits(L, ctx, model.n_vocab)
    td = time.perf_counter() - t0
    return {"decode_tokens": n, "decode_seconds": td, "decode_tok_s": n / td if td > 0 else None,
            "decode_question_tokens": len(question), "decode_question_seconds": tq, "decode_eog_masked": masked}


def main() -> int:
    try:
        res = child(json.loads(sys.stdin.read()))
    except KvpotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
