"""One run of the pot on SmolLM2, locally or through RPC servers, saved as .npz (used by test_rpc.py).

RPC devices, once registered, stay for the life of a process, so the local reference and the RPC
run each get a fresh process: `python rpc_child.py MODEL OUT.npz [--rpc HOST:PORT,...] [--keep REF.npz]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHUNK = 64
N_CTX = 512
N_KEEP = 100
# one thread: on a busy 2-core machine two spinning OpenMP threads make the local run many times slower
N_THREADS = 1


def _log_to(path: Path) -> None:
    """llama.cpp's whole log to a file, through kvpot's C filter (errors still reach stderr)."""
    from kvpot.runtime import logs

    logs.install(path)


def _buffer_lines(path: Path) -> list[str]:
    """llama.cpp's load log lines that say which device holds weights and KV cache."""
    return [ln.strip() for ln in path.read_text(errors="replace").splitlines() if "buffer size" in ln]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rpc")
    ap.add_argument("--keep", help="use the kept cells of this earlier run (so both runs compact alike)")
    a = ap.parse_args()

    from kvpot.runtime.library import load

    load()
    log_path = Path(a.out).with_suffix(".log")
    log_path.unlink(missing_ok=True)
    _log_to(log_path)
    devices: list[str] = []
    if a.rpc:
        from kvpot.runtime.rpc import parse_endpoints, use_servers

        devices = use_servers(parse_endpoints(a.rpc))

    from potlib import decode_chunks

    from kvpot.bench.logbook import logbook
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy
    from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
    from kvpot.runtime.pot import Pot

    out: dict[str, np.ndarray] = {}
    model = LlamaModel(a.model)
    text, question, _ = logbook(n_entries=8, seed=11)
    doc = (model.bos() + model.tokenize(text))[:300]
    n = len(doc)

    # raw pot calls: taps on the last chunk's rows, log-probs, per-head compaction with CR-RoPE
    ctx = LlamaContext(model, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=N_THREADS))
    pot = Pot(ctx)
    head, last = doc[:n - CHUNK], doc[n - CHUNK:]
    decode_chunks(ctx, head, CHUNK)
    rows = [n - CHUNK + r for r in (0, 17, 40, CHUNK - 1)]
    pot.tap_request(rows)
    pot.logprobs_request(n - CHUNK, last[1:] + [last[-1]])
    ctx.decode(last, n - CHUNK, logits="all")
    out["taps"] = pot.tap_get(n)
    out["logprobs"] = pot.logprobs_get(CHUNK)[:CHUNK - 1]
    pot.tap_clear()
    pot.logprobs_clear()
    if a.keep:
        keep = np.load(a.keep)["keep"]
    else:
        keep = np.sort(np.argsort(-out["taps"], axis=-1, kind="stable")[..., :N_KEEP], axis=-1)
    out["keep"] = keep
    pot.compact(keep, cr_rope=True)
    st = pot.stats()
    out["stats"] = np.array([st.n_cells_used, st.pos_next, st.n_compactions])
    n = len(pot.layer_ids)  # the first, a middle and the last layer: on the first server and on the last
    out["read"] = np.stack([np.stack([pot.read(il, h, w, 0, N_KEEP, 64) for h in range(pot.n_head_kv) for w in "kv"])
                            for il in (0, n // 2, n - 1)])
    q = model.tokenize("\nQuestion: " + question + "\nAnswer:")
    decode_chunks(ctx, q, CHUNK, st.pos_next)
    out["logits"] = ctx.logits_last()
    ctx.close()

    # the engine end to end: InfiniPot picks per head from its taps, compacts twice, answers
    eng = Engine(a.model, make_policy("infinipot:pot=256,keep=128"),
                 EngineConfig(budget=256, chunk=64, n_threads=N_THREADS, answer_reserve=64))
    long_text, long_q, _ = logbook(n_entries=16, seed=5)
    eng.set_question(long_q)
    eng.feed_text(long_text)
    out["engine_positions"] = eng.positions.copy()
    out["engine_compactions"] = np.array([eng.n_compactions])
    out["answer"] = np.frombuffer("".join(eng.answer("\nQuestion: " + long_q + "\nAnswer:", 16)).encode(),
                                  dtype=np.uint8)
    eng.close()
    model.close()
    np.savez(a.out, **out, devices=np.array(devices), buffer_lines=np.array(_buffer_lines(log_path)))


if __name__ == "__main__":
    main()
