"""Run budget x chunk x question x policy combinations the way `kvpot ask` does, in one process.

Used by test_limits.py in a subprocess: a combination that reaches a llama.cpp assertion aborts
this process, and the test sees which one from the last line printed. For each combination it
prints one JSON line: the refusal (a KvpotError, said before reading) or, after reading and a
short answer, the most cells the pot held while reading and the capacity it may use.

    python limits_worker.py MODEL_PATH DOC_PATH COMBOS_JSON
"""

from __future__ import annotations

import json
import sys

from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.checks import check_pot_room, check_settings_fit
from kvpot.session.session import Session
from kvpot.session.settings import resolve_settings


def run_one(facts, doc: str, combo: dict) -> dict:
    cli = {"policy": combo["policy"], "budget": combo["budget"], "chunk": combo["chunk"], "threads": 1,
           "prompt": "completion", "max_tokens": 4}
    settings = resolve_settings(None, {}, cli, path=None)
    check_settings_fit(facts, settings)
    session = Session(facts, "model", settings)
    try:
        session.set_question(combo["question"])
        check_pot_room(session.engine)
        eng = session.engine
        peak = 0
        decode = eng.ctx.decode

        def watched(tokens, pos0, logits="last", **kw):
            nonlocal peak
            decode(tokens, pos0, logits=logits, **kw)
            peak = max(peak, eng.pot.stats().n_cells_used)

        eng.ctx.decode = watched
        session.read(collect_sources([doc]))
        read_peak, capacity = peak, eng._capacity()
        "".join(session.ask(combo["question"]))
        return {"ok": True, "peak": read_peak, "capacity": capacity}
    finally:
        session.engine.close()


def main() -> None:
    model, doc, combos = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    facts = read_model_facts(model)
    for combo in combos:
        print(json.dumps({"combo": combo, "start": True}), flush=True)
        try:
            out = run_one(facts, doc, combo)
        except KvpotError as e:
            out = {"ok": False, "error": str(e)}
        print(json.dumps({"combo": combo, **out}), flush=True)


if __name__ == "__main__":
    main()
