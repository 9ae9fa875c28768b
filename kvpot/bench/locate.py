"""`kvpot bench locate`: how well each locator (kvpot.session.locating: keys, bm25, mix, pot) finds the passages a
question needs after one read past the pot, scored on ranks as well as on what the focused read would take.

The inputs are `kvpot bench qa`'s joined inputs (kvpot.bench.qa_inputs, no multi-key needles) of the question set's
lexical, paraphrase and two-passage questions (the tuning questions unless --heldout), each read ONCE with the
policy and budget given; then every question of it is located by every locator on that one reading (the
conversation reset after the pot's locating answer, so each question is the first). Per question and locator:

- the rank (1 = first) of each gold passage (the question's passages, kvpot.bench.qa_sources.find_passage, as
  stream positions) in the locator's ranking (kvpot.locator.mix.ranked_spans: the keys' blocks, bm25's and mix's
  passages, the pot's ranked passages): the first block or passage that overlaps it; `rank` is the answer's
  passage's, `all_top8` whether every gold passage ranks in the top 8;
- hit@focus: whether the focused read's windows (kvpot.session.focus.spans of the locator's mass, PASSAGES
  passages) hold every gold passage whole;
- the seconds locating took (the mass, as the focused read asks it: locate_with). bm25's index is built once per
  input before its questions (`index_seconds`), as a chat builds it at its first question.

Per kind and locator: n, hit@focus with its 95 % Wilson interval, the mean reciprocal rank of the answer's passage
(0 where unranked), all-in-top-8 and the mean seconds. The JSON is written after every input (`--resume` goes on
after the inputs it holds).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvpot.bench.qa_report import wilson
from kvpot.errors import KvpotError

KINDS = ("lexical", "paraphrase", "two-passage")
LOCATORS = ("keys", "bm25", "mix", "pot")
TOP = 8            # all_top8: every gold passage within this many of the ranking
SPANS_KEPT = 32    # of each ranking, the first spans the JSON records


@dataclass
class LocatePlan:
    model: str
    length: int = 32768
    budget: int = 2048
    policy: str = "infinipot"
    chunk: int = 512
    threads: int = 2
    heldout: bool = False
    pot: bool = True
    inputs: int | None = None         # the first N inputs (all without it)
    seed: int = 0
    bm25_lines: list[int] = field(default_factory=list)  # more passage sizes: locators "bm25@N", "mix@N"
    resume: bool = False

    def locators(self) -> list[str]:
        extra = [f"{name}@{n}" for n in self.bm25_lines for name in ("bm25", "mix")]
        return [n for n in LOCATORS if self.pot or n != "pot"] + extra


def _lines(name: str) -> tuple[str, int]:
    from kvpot.locator.lexical import LINES

    base, _, n = name.partition("@")
    return base, int(n) if n else LINES


def locate(name: str, session, question: str):
    """The Located the focused read would take from locator `name` ("bm25@12": bm25 over 12-line passages)."""
    from kvpot.session.focus import Located
    from kvpot.session.locating import BLOCKS, locate_with

    base, lines = _lines(name)
    if "@" not in name:
        return locate_with(name, session, question)
    if base == "bm25":
        from kvpot.locator.lexical import bm25_mass
        return Located("", bm25_mass(session, question, BLOCKS, lines), 0)
    from kvpot.locator.mix import mix_mass
    return Located("", mix_mass(session, question, BLOCKS, lines), 0)


def rank_of(spans: list[list[int]], gold: list[int]) -> int | None:
    """1 + the index of the first span [first, end) overlapping the gold stream span [first, end); None: none does."""
    return next((i + 1 for i, (a, b, *_) in enumerate(spans) if a < gold[1] and gold[0] < b), None)


def held(windows: list[list[int]], gold: list[int]) -> bool:
    """Whether a window (characters [start, end)) holds the gold passage (characters) whole."""
    return any(a <= gold[0] and gold[1] <= b for a, b in windows)


def score_locator(name: str, session, question: str, golds_pos: list[list[int]], golds_chars: list[list[int]]) -> dict:
    from kvpot.locator.mix import ranked_spans
    from kvpot.session.focus import spans as focus_spans

    t0 = time.perf_counter()
    try:
        located = locate(name, session, question)
    except KvpotError as e:
        return {"seconds": round(time.perf_counter() - t0, 3), "error": str(e), "ranks": [None] * len(golds_pos),
                "rank": None, "all_top8": False, "hit_focus": False, "windows": [], "spans": [], "ranked": 0}
    seconds = time.perf_counter() - t0
    base, lines = _lines(name)
    ranked = ranked_spans(base, session, question, located, lines)
    smap = session.source_map
    windows = [list(w) for w in focus_spans(located.mass, smap, session.engine.policy.sink_tokens())]
    # every rank is taken over the whole ranking; the JSON keeps its first SPANS_KEPT spans
    ranks = [rank_of(ranked, g) for g in golds_pos]
    out = {"seconds": round(seconds, 3), "ranks": ranks, "rank": ranks[0] if ranks else None,
           "all_top8": bool(ranks) and all(r is not None and r <= TOP for r in ranks),
           "hit_focus": bool(golds_chars) and all(held(windows, g) for g in golds_chars),
           "windows": windows, "ranked": len(ranked),
           "spans": [[a, b, round(s, 6)] for a, b, s in ranked[:SPANS_KEPT]]}
    if located.answer:
        out["answer"] = located.answer
    return out


def summary(rows: list[dict], locators: list[str]) -> dict:
    """Per locator, per kind (and all kinds): n, hit@focus (share and 95 % Wilson interval), the mean reciprocal
    rank of the answer's passage, all gold passages in the top 8, and the mean seconds of locating."""
    out: dict = {}
    for name in locators:
        out[name] = {}
        for kind in (*KINDS, "all"):
            sel = [r["locators"][name] for r in rows if name in r["locators"] and kind in ("all", r["kind"])]
            if not sel:
                continue
            n = len(sel)
            k = sum(c["hit_focus"] for c in sel)
            lo, hi = wilson(k, n)
            out[name][kind] = {
                "n": n, "hit_focus": k, "hit_focus_share": round(k / n, 4), "interval_95": [round(lo, 4), round(hi, 4)],
                "mrr": round(sum(1 / c["rank"] for c in sel if c["rank"]) / n, 4),
                "all_top8": sum(c["all_top8"] for c in sel),
                "seconds_mean": round(sum(c["seconds"] for c in sel) / n, 3)}
    return out


def table(summ: dict) -> str:
    """The summary as text lines: locator, kind, n, hit@focus (interval), MRR, all-in-top-8, seconds."""
    lines = [f"{'locator':<10} {'kind':<12} {'n':>3}  {'hit@focus':<22} {'MRR':>6}  {'top8':>5}  {'s/question':>10}"]
    for name, kinds in summ.items():
        for kind, f in kinds.items():
            lo, hi = f["interval_95"]
            hit = f"{f['hit_focus']}/{f['n']} ({lo:.0%}-{hi:.0%})"
            lines.append(f"{name:<10} {kind:<12} {f['n']:>3}  {hit:<22} {f['mrr']:>6.3f}  {f['all_top8']:>5}  "
                         f"{f['seconds_mean']:>10.2f}")
    return "\n".join(lines)


def run(plan: LocatePlan, json_out: Path | None, say=lambda msg: None) -> dict:
    from kvpot.api.plan import plan_read
    from kvpot.bench.qa_inputs import build_inputs
    from kvpot.bench.qa_questions import load_set
    from kvpot.bench.qa_sources import find_passage
    from kvpot.bench.throughput import run_meta
    from kvpot.locator.lexical import LINES, index_for
    from kvpot.locator.sources import position_at
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel
    from kvpot.safe_write import write_text_file

    meta = run_meta()
    facts, known = resolve_model(plan.model)
    name = known.name if known else facts.name
    qs = [q for q in load_set().questions if q.kind in KINDS and q.heldout == plan.heldout]
    if not qs:
        raise KvpotError("no question of the set fits (lexical, paraphrase or two-passage, "
                         f"{'held-out' if plan.heldout else 'tuning'}) on this machine")
    vocab = LlamaModel(str(facts.path))
    try:
        inputs = build_inputs(qs, lambda t: len(vocab.tokenize(t)), plan.length, plan.seed, multikey=False)
    finally:
        vocab.close()
    inputs = inputs[:plan.inputs] if plan.inputs is not None else inputs
    by_id = {q.id: q for q in qs}
    locators = plan.locators()
    # the keys are kept only for a locator that scores them: "mix" scores them, and every locator is asked here
    options = {"threads": plan.threads, "policy": plan.policy, "budget": plan.budget, "chunk": plan.chunk,
               "locator": "mix"}
    rows: list[dict] = []
    reads: list[dict] = []
    if plan.resume and json_out is not None and json_out.exists():
        try:
            old = json.loads(json_out.read_text())
            same = {k: old["plan"][k] for k in ("model", "length", "budget", "policy", "heldout", "seed", "chunk")}
        except (ValueError, KeyError, TypeError):
            raise KvpotError(f"{json_out} is not a bench locate results file; remove it or drop --resume") from None
        if same != {k: getattr(plan, k) for k in same}:
            raise KvpotError(f"{json_out} holds another plan ({same}); remove it or drop --resume")
        rows, reads = old["rows"], old["reads"]
    done = {r["input"] for r in reads}

    def write() -> dict:
        out = meta | {"loadavg_end": run_meta()["loadavg_start"], "model": name, "plan": asdict(plan),
                      "locators": locators, "bm25_lines": LINES, "inputs": [j.index for j in inputs],
                      "n": len(rows), "summary": summary(rows, locators), "reads": reads, "rows": rows}
        if json_out is not None:
            write_text_file(json_out, json.dumps(out, indent=1) + "\n", "benchmark JSON")
        return out

    with tempfile.TemporaryDirectory(prefix="kvpot-bench-locate-") as tmp:
        for joined in inputs:
            if joined.index in done:
                continue
            path = Path(tmp) / f"locate-{plan.length}-{joined.index}.txt"
            path.write_text(joined.text, encoding="utf-8")
            # planned as `kvpot chat` plans a reading (kvpot.api.plan): the settings merged over the config file and
            # the model's defaults, every check before the model loads; kept resettable, each locator asked first
            reading = plan_read([str(path)], name if known else str(facts.path), resettable=True, **options)
            with reading.open() as s:
                t0 = time.perf_counter()
                s.read(reading.sources)
                read = {"input": joined.index, "tokens": s.doc_tokens, "read_seconds": round(time.perf_counter() - t0, 2),
                        "compactions": s.engine.stats().n_compactions,
                        "keys_bytes": s.engine.block_keys.nbytes if s.engine.block_keys is not None else 0,
                        "index_seconds": {}}
                say(f"input {joined.index}: read {read['tokens']:,} tokens in {read['read_seconds']:.0f} s")
                for n in sorted({_lines(x)[1] for x in locators if x.startswith(("bm25", "mix"))}):
                    t1 = time.perf_counter()
                    index_for(s, n)
                    read["index_seconds"][str(n)] = round(time.perf_counter() - t1, 3)
                smap = s.source_map
                for a in joined.asks:
                    q = by_id[a.id]
                    chars = [list(find_passage(joined.text, p)) for p in q.passages]
                    pos = [[position_at(smap, c0), position_at(smap, c1)] for c0, c1 in chars]
                    row = {"input": joined.index, "id": q.id, "kind": q.kind, "heldout": q.heldout,
                           "question": a.question, "depth": a.depth, "gold_chars": chars, "gold_positions": pos,
                           "locators": {}}
                    for loc in locators:
                        row["locators"][loc] = score_locator(loc, s, a.question, pos, chars)
                        if s.turns:
                            s.reset_conversation()
                    rows.append(row)
                    say(f"{q.id} ({q.kind}): " + ", ".join(
                        f"{loc} {'hit' if c['hit_focus'] else 'miss'} #{c['rank']}" for loc, c in row["locators"].items()))
            reads.append(read)
            done.add(joined.index)
            write()
    return write()


def main(plan: LocatePlan, json_out: Path | None) -> dict:
    out = run(plan, json_out, say=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(table(out["summary"]), file=sys.stderr)
    return out
