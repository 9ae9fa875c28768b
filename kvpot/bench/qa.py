"""`kvpot bench qa`: answer quality on real documents (kvpot/bench/qa_set.json over the joined inputs of
kvpot.bench.qa_inputs), per model, policy and length, read and asked as `kvpot ask` does (a Session, the
model's chat template, settings resolved as ask resolves them).

Each input is read once per policy and its questions are asked in turn, the conversation reset between
them (Session.reset_conversation: back to the state right after reading). With full attention that is
exactly what reading the input again per question gives. A pot policy then reads without knowing the
question, so InfiniPot's catalyst (CaP-Q) is not used, as in `kvpot chat`; `per_question` reads the input
again for each question with the question set first, as `kvpot ask` does (CaP-Q on; one read per question), and
`question_before` puts it before the document too (as `kvpot ask --question-before on`; full attention is then read
once per question as well).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvpot.bench.qa_inputs import JoinedInput, build_inputs, doc_tokens, whole_inputs
from kvpot.bench.qa_questions import Question
from kvpot.bench.qa_read_save import QaReadSave, QaReadStopped, QaSaves, QaSoFar, this_part
from kvpot.bench.qa_score import contains, exact, judge, normalize, question_facts
from kvpot.bench.read_lines import reading_line
from kvpot.errors import KvpotError
from kvpot.locator.sources import reread
from kvpot.session.focus import focus_for, locate, ranked_spans, why_not, windows
from kvpot.session.locating import locate_with
from kvpot.session.prompting import choose_format, question_frame

if TYPE_CHECKING:
    from kvpot.api.plan import Plan as ReadingPlan
    from kvpot.session.session import ReadProgress, Session

DEFAULT = "default"    # the policy and budget `kvpot ask` chooses for this model and input
# closed book: each question after a document that holds nothing, read with full attention. What the model
# answers from what it already knows: a floor a reading must beat before its right answers can be credited
# to what it kept of the input (licence dates, famous authors and defaults are often known without it)
CLOSED = "none"
NO_DOCUMENT = "(No document.)\n"
SAMPLE_ABOVE = 32768   # lengths past this ask a sample of the questions (the 128K part)
MAX_TOKENS = 48        # a short factual answer fits; a rambling one is cut here


@dataclass(frozen=True)
class Plan:
    model: str                 # a known name or a .gguf path
    policies: list[str]
    lengths: list[int]
    seed: int = 0
    sample: int = 8            # questions per length above SAMPLE_ABOVE
    limit: int | None = None   # questions per length at every length (None: all)
    threads: int = 2
    budget: int | None = None  # cells for pot policies (None: as ask resolves it)
    per_question: bool = False
    multikey: bool = True
    group: int | None = None   # questions per input (None: qa_inputs.per_input)
    only: tuple[str, ...] = ()  # ask only these question ids (the inputs are still built from the whole set)
    kinds: tuple[str, ...] = ()  # ask only questions of these kinds ("multikey" for the needles; inputs as with only)
    question_before: bool = False  # with per_question: the question before the document too (--question-before on)
    focus: bool = False        # with per_question: answer from the focused read, as `kvpot ask` (kvpot.session.focus)
    locator: str | None = None  # with focus and one read asked every question, as `kvpot chat` past the pot: each
                               # question's passages located this way (kvpot.session.locating) and read again
    closed_book: bool = False  # also ask every question closed book (CLOSED) first; each case records that verdict


def case_key(r: dict) -> tuple:
    return (r["model"], r["policy"], r["length"], r["seed"], r["id"], bool(r.get("per_question", False)),
            bool(r.get("question_before", False)), bool(r.get("focus", False)), r.get("locator"))


def closed_key(r: dict) -> tuple[str, str]:
    """What a closed-book answer depends on: the model and the question (no input is read)."""
    return r["model"], normalize(r["question"])


def with_closed_book(results: list[dict]) -> None:
    """Every case that was asked of an input gets `closed_book_correct`: the verdict of the same model on
    the same question asked closed book, where one of `results` holds it (in place)."""
    closed = {closed_key(r): r["correct"] for r in results if r.get("policy") == CLOSED and "correct" in r}
    for r in results:
        if r.get("policy") != CLOSED and "question" in r and closed_key(r) in closed:
            r["closed_book_correct"] = closed[closed_key(r)]


def same_reading(base: dict, todo: list, readings: dict, resolved: str, budget, key: Callable[[dict], tuple]):
    """(the cases another spec's reading of this input already answered, as this spec's; the asks left): a spec
    that resolves to the same policy and budget reads and answers the same (greedy), so its cases are copied
    (`same_reading_as` names the spec that read). `key`: what decides a reading (reading_key, or a bench's own)."""
    same = readings.get(key({**base, "resolved_policy": resolved, "budget": budget}), {})
    copies = [{**same[a.id], **base, "same_reading_as": same[a.id].get("same_reading_as", same[a.id]["policy"])}
              for a in todo if a.id in same]
    return copies, [a for a in todo if a.id not in same]


def reading_key(r: dict) -> tuple:
    """What decides a case's reading and answer besides the question: two policy specs that resolve to
    the same policy and budget for the same input (`-P default` is full attention wherever the input
    fits, as `-P full` is) read and answer identically (greedy), so the second one's cases are copies."""
    return (r["model"], r["length"], r["seed"], r["input"], bool(r.get("per_question", False)),
            bool(r.get("question_before", False)), bool(r.get("focus", False)), r["resolved_policy"], r["budget"],
            r.get("locator"))


def questions_for(questions: list[Question], length: int, plan: Plan) -> list[Question]:
    """The whole set, or a seeded sample of the questions asked inside a haystack (the same sample for
    every model and policy). A sample leaves the whole-document questions out: their inputs are their own
    files (whole_for), so a sample of `n` asks `n` questions of inputs of this length."""
    n = plan.sample if length > SAMPLE_ABOVE else plan.limit
    inside = [q for q in questions if not q.whole_input]
    if n is None:
        return list(questions)
    if n >= len(inside):
        return inside
    picked = set(q.id for q in random.Random(f"qa-sample-{plan.seed}-{length}").sample(inside, n))
    return [q for q in questions if q.id in picked]


def whole_for(questions: list[Question], lengths: tuple[int, ...], count_tokens: Callable[[str], int],
              first_index: dict[int, int]) -> dict[int, list[JoinedInput]]:
    """The whole-document questions' inputs (each source alone and whole, a few thousand tokens) by the grid
    length they are asked at: the smallest that holds the document, so each is asked once per policy and
    its case sits beside that length's others. A document longer than every length is left out. Their
    indices follow `first_index[length]` (that length's haystack inputs), so input files never collide."""
    out: dict[int, list[JoinedInput]] = {n: [] for n in lengths}
    for w in whole_inputs(questions, count_tokens):
        fits = [n for n in sorted(lengths) if w.tokens <= doc_tokens(n)]
        if fits:
            n = fits[0]
            out[n].append(replace(w, index=first_index[n] + len(out[n])))
    return out


def run(plan: Plan, questions: list[Question], done: list[dict] = (), on_case: Callable[[dict], None] = lambda r: None,
        say: Callable[[str], None] = lambda m: None, on_read: Callable[[str], None] = lambda m: None,
        saves: QaSaves | None = None, stop: Callable[[], bool] = lambda: False) -> list[dict]:
    """Every case not in `done`; returns done + the new cases (each also passed to on_case as it ends).
    `on_read` hears, after every chunk of a reading, how far it got (a read past the window takes up to
    two hours: the caller decides how often to show it). `saves`: where each reading is saved as it goes
    and gone on from (kvpot.bench.qa_read_save); `stop()` true (a signal, set by the caller) stops the
    reading at its next chunk with QaReadStopped, after saving it where `saves` allows."""
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel

    facts, known = resolve_model(plan.model)
    name = known.name if known else facts.name
    vocab = LlamaModel(str(facts.path))
    try:
        frame = question_frame(choose_format(vocab, _settings_prompt(known)))
        count = lambda t: len(vocab.tokenize(t))  # noqa: E731
        inputs = {n: build_inputs(questions_for(questions, n, plan), count, n, plan.seed,
                                  group=plan.group, multikey=plan.multikey) for n in plan.lengths}
        whole = whole_for(questions_for(questions, min(plan.lengths), plan), tuple(plan.lengths), count,
                          {n: len(inputs[n]) for n in plan.lengths})
        for n in plan.lengths:
            inputs[n] += whole[n]
    finally:
        vocab.close()
    asked = {a.id for n in plan.lengths for joined in inputs[n] for a in joined.asks}
    unknown = sorted(set(plan.only) - asked)
    if unknown:
        raise KvpotError(f"--only: no question {', '.join(unknown)} in these inputs (ids as in the JSON; "
                         f"multikey-N for input N's access code)")
    # cases asked with another prompt (an older kvpot's) are asked again, not mixed in
    results = [r for r in done if r.get("model") != name or r.get("frame") == frame]
    if len(results) < len(done):
        say(f"{len(done) - len(results)} earlier cases of {name} were asked with another prompt; asking them again")
    have = {case_key(r) for r in results}
    # closed book first, so that every case read after it records the closed-book verdict of its question
    specs = ([CLOSED] if plan.closed_book or CLOSED in plan.policies else []) + [p for p in plan.policies if p != CLOSED]
    facts_of = {q.id: question_facts(q) for q in questions}
    closed = {closed_key(r): r["correct"] for r in results if r.get("policy") == CLOSED and "correct" in r}
    readings: dict[tuple, dict[str, dict]] = {}  # reading_key -> that reading's cases by question id
    for r in results:
        if "resolved_policy" in r:
            readings.setdefault(reading_key(r), {})[r["id"]] = r
    with tempfile.TemporaryDirectory(prefix="kvpot-qa-") as tmp:
        for spec in specs:
            for n in plan.lengths:
                for joined in inputs[n]:
                    path = Path(tmp) / f"qa-{n}-{joined.index}.txt"
                    if spec == DEFAULT:  # what `default` resolves to moves with the registry: older reads are redone
                        stale = _stale_default_cases(plan, facts, known, name, n, joined, path, results)
                        if stale:
                            say(f"{len(stale)} earlier {DEFAULT} cases of {name} at {n:,} read with another "
                                f"policy or budget than {DEFAULT} is now; asking them again")
                            results = [r for r in results if id(r) not in stale]
                            have = {case_key(r) for r in results}
                    todo = [a for a in joined.asks if (not plan.only or a.id in plan.only)
                            and (not plan.kinds or a.kind in plan.kinds)
                            and (name, spec, n, plan.seed, a.id, plan.per_question, _before(plan, spec),
                                 _focus(plan, spec), _locator(plan, spec)) not in have]
                    if not todo:
                        continue
                    say(f"{spec} {n:,}: input {joined.index + 1}/{len(inputs[n])}, {len(todo)} questions")
                    path.write_text(joined.text, encoding="utf-8")
                    for r in _run_input(plan, facts, known, name, spec, n, joined, todo, path, readings, frame,
                                        on_read, _Reading(saves, stop, say), facts_of):
                        if "correct" in r:
                            if spec == CLOSED:
                                closed[closed_key(r)] = r["correct"]
                            elif closed_key(r) in closed:
                                r["closed_book_correct"] = closed[closed_key(r)]
                        if "resolved_policy" in r:
                            readings.setdefault(reading_key(r), {}).setdefault(r["id"], r)
                        results.append(r)
                        on_case(r)
    with_closed_book(results)  # the cases of an earlier run too, where this one asked their questions closed book
    return results


def _stale_default_cases(plan: Plan, facts, known, name: str, n: int, joined: JoinedInput, path: Path,
                         results: list[dict]) -> set[int]:
    """The ids of this input's `default` cases (of this plan's way of asking) that were read with another
    policy or budget than `default` resolves to now: a resumed JSON written before the registry's default
    moved would otherwise mix the old pot's answers into the new default's line."""
    asked = (name, DEFAULT, n, plan.seed, plan.per_question, _before(plan, DEFAULT))
    mine = [r for r in results if "budget" in r and r.get("input") == joined.index
            and (k := case_key(r))[:4] + k[5:] == asked]
    if not mine:
        return set()
    path.write_text(joined.text, encoding="utf-8")
    reading, full = _settings(plan, facts, known, DEFAULT, path)
    settings = reading.settings
    # full attention's budget is the input's own size (with the question when it goes first), not a choice
    return {id(r) for r in mine if r.get("resolved_policy") != settings.policy
            or (not full and r["budget"] != settings.budget)}


def _before(plan: Plan, spec: str) -> bool:
    """Whether this spec's cases read with the question before the document (closed book reads no document)."""
    return plan.question_before and plan.per_question and spec != CLOSED


def _focus(plan: Plan, spec: str) -> bool:
    """Whether this spec's cases answer from a focused read where one applies (closed book reads nothing): a read
    per question (as `kvpot ask`), or one read and a locator (as `kvpot chat`)."""
    return plan.focus and (plan.per_question or plan.locator is not None) and spec != CLOSED


def _locator(plan: Plan, spec: str) -> str | None:
    """The locator this spec's cases are answered through (case_key's last field), or None."""
    return plan.locator if _focus(plan, spec) and not plan.per_question else None


def _settings_prompt(known) -> str:
    """The prompt format `kvpot ask` would use for this model (registry, then the user's config)."""
    from kvpot.session.settings import resolve_settings

    return resolve_settings(known.name if known else None, known.defaults if known else {}, {}).prompt


def _settings(plan: Plan, facts, known, spec: str, path: Path, question: str | None = None):
    """The reading `kvpot ask` would plan for this input (kvpot.api.plan: the settings merged and checked, the
    budget resolved, the policy built and fitted; `question`: the one asked, counted where it goes before the
    document), and whether it is full attention. Planned as a reading that keeps no copy: `_read` opens it
    resettable where one read is asked several questions."""
    from kvpot.api.plan import plan_read

    chosen = spec != DEFAULT
    # the reading keeps the keys where the locator scores them; a focused case sizes the default pot as `kvpot ask`
    # does on files (kvpot.session.beyond_window)
    reading = plan_read([str(path)], known.name if known else str(facts.path), question, resettable=False,
                        focus=_focus(plan, spec), question_first=plan.per_question, threads=plan.threads,
                        max_tokens=MAX_TOKENS, policy=spec if chosen else None,
                        question_before="on" if _before(plan, spec) else "off",
                        budget=plan.budget if chosen and spec.partition(":")[0].strip() != "full" else None,
                        locator=plan.locator)
    return reading, reading.settings.policy.partition(":")[0].strip().lower() == "full"


def _run_input(plan: Plan, facts, known, name: str, spec: str, n: int, joined: JoinedInput, todo, path: Path,
               readings: dict[tuple, dict[str, dict]], frame: str, on_read: Callable[[str], None], how: _Reading,
               facts_of: dict[str, dict]):

    base = {"model": name, "policy": spec, "length": n, "seed": plan.seed, "input": joined.index,
            "per_question": plan.per_question, "question_before": _before(plan, spec), "frame": frame}
    if _focus(plan, spec):
        base["focus"] = True
    if _locator(plan, spec) is not None:
        base["locator"] = plan.locator
    closed = spec == CLOSED
    if closed:  # the same questions and frame, no input: one tiny read per input (a few tokens)
        path = path.with_name("no-document.txt")
        path.write_text(NO_DOCUMENT, encoding="utf-8")
    try:
        reading, full = _settings(plan, facts, known, "full" if closed else spec, path)
    except KvpotError as e:  # full attention past the window or the memory: recorded, not retried
        for a in todo:
            yield {**base, **_ask_fields(a), "skipped": str(e)}
        return
    settings = reading.settings
    resolved = CLOSED if closed else settings.policy
    copies, todo = same_reading(base, todo, readings, resolved, settings.budget, reading_key)
    yield from copies
    if not todo:
        return
    # question first (as `kvpot ask` reads): one read per question for a pot, and for full attention too when
    # the question goes before the document; else one read asked every question in turn
    before = _before(plan, spec)
    reads = [[a] for a in todo] if plan.per_question and (before or not full) else [todo]
    for asks in reads:
        if before and full:  # the question is counted in the input, as ask counts it
            reading, full = _settings(plan, facts, known, spec, path, asks[0].question)
            settings = reading.settings
        # a read per question is named by its question, one read asked in turn by its input
        label = asks[0].id if plan.per_question and len(asks) == 1 else f"input {joined.index + 1}"
        saving = None
        if how.saves is not None and not closed:
            saving = how.saves.read({**base, "resolved_policy": resolved, "budget": settings.budget,
                                     "ids": [a.id for a in asks], "text_sha256": _sha256(joined.text)})
        s, part, peak = _read(plan, facts, name, reading, asks, path, f"{spec} {n:,}, {label}", saving, how, on_read)
        with s:
            st = s.stats()
            seconds = part.seconds + s.read_seconds
            read = {"resolved_policy": resolved if closed else s.policy_spec, "budget": settings.budget, "tokens": s.doc_tokens,
                    "read_seconds": round(seconds, 2), "read_tok_s": round(s.doc_tokens / seconds, 1) if seconds else None,
                    "compactions": st["compactions"], "question_before": s.settings.question_before == "on",
                    "peak_rss_mib": _rounded(peak)}
            if part.parts > 1:  # a reading in parts: the processes and CPUs that read it
                read |= {"read_parts": part.parts, "read_cpus": part.cpus}
            if _focus(plan, spec) and plan.locator is not None and not plan.per_question:
                yield from _located_answers(s, asks, plan.locator, base, read, facts, name, facts_of)
                asks = []
            focusing = _focus(plan, spec) and len(asks) == 1 and why_not(s) is None
            for i, a in enumerate(asks if not focusing else []):
                if i:
                    s.reset_conversation()
                t0 = time.perf_counter()
                answer = "".join(s.ask(a.question, max_tokens=MAX_TOKENS)).strip()
                yield {**base, **_ask_fields(a), **read, **_scored(answer, a, facts_of),
                       "answer_seconds": round(time.perf_counter() - t0, 2)}
            if focusing:
                t0 = time.perf_counter()
                located = locate(s, asks[0].question)
                pot = _scored(located.answer, asks[0], facts_of)
                read |= {"pot_answer": located.answer, "pot_correct": pot["correct"], "pot_contains": pot["contains"]}
                try:
                    text, focused = focus_for(s, located)
                    # where the passages read again lie, as shares of the input's characters (beside `depth`,
                    # a share of its tokens): whether the question's passage was among them
                    whole = max(s.source_map.end_char, 1)
                    read["focus_spans"] = [[round(w.start / whole, 4), round(w.end / whole, 4)] for w in text.windows]
                    read["focus_ranked"] = _ranked(s, located, asks[0])
                except KvpotError as e:  # as `kvpot ask`: the answer comes from the pot, and why is said
                    focusing = False
                    yield {**base, **_ask_fields(asks[0]), **read, **_scored(located.answer, asks[0], facts_of),
                           "focus_refused": str(e), "answer_seconds": round(time.perf_counter() - t0, 2)}
        if focusing:  # the pot's session is closed: the focused read loads the model afresh, as `kvpot ask` does
            yield {**base, **_ask_fields(asks[0]), **read,
                   **_focused(facts, name, focused, text, located, asks[0], t0, facts_of)}
        if saving is not None:  # its cases are written down: the save has done its job
            saving.drop()


@dataclass(frozen=True)
class _Reading:
    """How a grid's readings are saved and stopped (run's `saves`, `stop`, `say`)."""
    saves: QaSaves | None
    stop: Callable[[], bool]
    say: Callable[[str], None]


def _read(plan: Plan, facts, name: str, reading: ReadingPlan, asks, path: Path, what: str, saving: QaReadSave | None,
          how: _Reading, on_read: Callable[[str], None]) -> tuple[Session, QaSoFar, float | None]:
    """A Session that has read `path` as `reading` plans it (opened through kvpot.api: the caller closes it),
    gone on from its save where there is one;
    the reading's figures before this process's part (and this part counted), and its peak RSS in MiB
    (None where the peak cannot be reset: it would hold the readings before it).

    With `saving`, the reading stops every `saves.every` seconds to save and goes on at once; `stop()`
    stops it at the next chunk (a signal: at once) with QaReadStopped, after a save where it can."""
    from kvpot.api import ReadingStopped
    from kvpot.bench.process import ReadingPeak
    from kvpot.ingest import collect_sources

    if how.stop():
        raise QaReadStopped(what, 0, None)
    resettable = len(asks) > 1  # as `kvpot ask` when asked once
    if saving is not None and not how.saves.resume:
        saving.drop()
    so_far = saving.load(how.say) if saving is not None else None
    peak = ReadingPeak()
    peak.restart(0.0)  # this reading's peak: the model's load and the read, weights included
    measured = peak.start is not None
    s = saving.reopen(facts, name, plan.threads, resettable, so_far, how.say) if so_far is not None else None
    if s is None:
        so_far = None
        s = reading.again(resettable=resettable).open()
    part = this_part(so_far)
    try:
        if so_far is not None:
            how.say(f"{what}: going on from the save of its first {s.doc_tokens:,} tokens")
            peak.restart(so_far.peak_rss_mib or 0.0)  # the restore's own peak (the saved state beside the cache) is not the reading's
        if len(asks) == 1 and plan.per_question:
            s.set_question(asks[0].question)  # CaP-Q, as `kvpot ask` reads
        if saving is not None and s.disk_need(s.engine.ctx.n_ctx) is not None:
            saving = None  # its block store is not in the context (kvpot.bench.qa_read_save)
        point = s.read_point if so_far is not None else None
        sources = collect_sources([str(path)])
        lines = _read_lines(what, on_read, s.doc_tokens if so_far is not None else 0)
        last = time.perf_counter()

        def progress(p: ReadProgress) -> None:
            lines(p)
            if how.stop() or (saving is not None and time.perf_counter() - last >= how.saves.every):
                raise ReadingStopped

        while True:
            try:
                s.read(sources, progress, resume=point)
                break
            except ReadingStopped:
                stopped = how.stop()
                if saving is None or s.read_point is None:
                    raise QaReadStopped(what, s.doc_tokens, None) from None
                figures = replace(part, tokens=s.doc_tokens, seconds=part.seconds + s.read_seconds,
                                  peak_rss_mib=_rounded(peak.now()) if measured else None)
                saving.save(s, figures)
                peak.restart(figures.peak_rss_mib or 0.0)  # nor is the save's (the state exported beside the cache)
                if stopped:
                    raise QaReadStopped(what, s.doc_tokens, saving.context) from None
                point, last = s.read_point, time.perf_counter()
    except BaseException:
        s.close()
        raise
    return s, part, peak.now() if measured else None


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_lines(what: str, on_read: Callable[[str], None], before: int = 0) -> Callable[[ReadProgress], None]:
    """A Session.read progress callback that tells `on_read` how far the reading is (`before`: the tokens
    a reading gone on from its save had read)."""
    t0 = time.perf_counter()

    def progress(p: ReadProgress) -> None:
        on_read(reading_line(what, p.tokens, p.est_total, time.perf_counter() - t0, p.compactions, before))
    return progress


def _rounded(mib: float | None) -> float | None:
    return None if mib is None else round(mib, 1)


def _scored(answer: str, a, facts_of: dict[str, dict]) -> dict:
    """The answer and its verdicts: `correct` strict (kvpot.bench.qa_score: the reference and no competing
    answer, the question's candidates from the set by id, a multi-key needle's other codes), `contains` the
    whole-word check alone, `named` the competing answers it gave (where it gave one)."""
    facts = {"candidates": tuple(a.distractors)} if a.task == "multikey" else facts_of.get(a.id, {})
    v = judge(answer, list(a.refs), a.question, **facts)
    out = {"answer": answer, "exact": exact(answer, list(a.refs)), "correct": v.right,
           "contains": contains(answer, list(a.refs), a.question), "scoring": "strict",
           "distractor": contains(answer, list(a.distractors), a.question) if a.distractors else False}
    return out | ({"named": list(v.named)} if v.named else {})


def _ranked(s, located, a) -> list[dict]:
    """The passages the locating answer drew on, best first, as the focused read widens them before merging:
    where each lies (shares of the input's characters), its share of the answer's attention, and what of the
    question's references and distractors its text holds. Says whether the reader saw the asked code ranked
    above the distractors' (multi-key misses past the window name a distractor from among the passages)."""
    smap = s.source_map
    whole = max(smap.end_char, 1)
    ranked = ranked_spans(located.mass, smap, s.engine.policy.sink_tokens())
    texts = windows(reread(s), smap, [(lo, hi) for lo, hi, _ in ranked])  # the inputs read once for all
    return [{"at": [round(lo / whole, 4), round(hi / whole, 4)], "share": round(share, 4),
             "refs": [r for r in a.refs if r in w.text], "distractors": [d for d in a.distractors if d in w.text]}
            for (lo, hi, share), w in zip(ranked, texts)]


def _focused(facts, name: str, settings, text, located, a, t0: float, facts_of: dict[str, dict]) -> dict:
    """The answer of the focused read of `text` (the passages the pot's answer drew on, `located` by it, `settings`
    its own), opened through kvpot.api.focusing as `kvpot ask` opens it, with its figures;
    t0: when locating began (focus_seconds counts locating, loading, reading and answering)."""
    from kvpot.api.focusing import Focus, open_focused

    with open_focused(Focus(text, settings, located, {}), facts, name) as f:
        f.read(text)
        answer = "".join(f.ask(a.question, max_tokens=MAX_TOKENS)).strip()
        got = {"focus_passages": len(text.windows), "focus_tokens": f.doc_tokens,
               "focus_read_seconds": round(f.read_seconds, 2)}
    return {**_scored(answer, a, facts_of), **got, "focus_seconds": round(time.perf_counter() - t0, 2)}


def _located_answers(s, asks, locator: str, base: dict, read: dict, facts, name: str, facts_of: dict[str, dict]):
    """One read asked every question as `kvpot chat` past the pot asks them (kvpot.api.Document.turn): each
    question's passages located by `locator` in what the read kept, read again with full attention in a session
    of their own, and answered there; where nothing was left out (or the passages cannot be read again) the pot
    answers, as chat's would. Each case records where the passages lay and the locating's own seconds."""
    for i, a in enumerate(asks):
        if i:
            s.reset_conversation()
        t0 = time.perf_counter()
        if why_not(s) is not None:
            answer = "".join(s.ask(a.question, max_tokens=MAX_TOKENS)).strip()
            yield {**base, **_ask_fields(a), **read, **_scored(answer, a, facts_of), "focus_refused": why_not(s),
                   "answer_seconds": round(time.perf_counter() - t0, 2)}
            continue
        try:  # a question the locator routes to the pot (locating.route) is answered there, as `kvpot chat` does
            located = locate_with(locator, s, a.question)
            locate_seconds = time.perf_counter() - t0
            text, focused = focus_for(s, located)
        except KvpotError as e:
            answer = "".join(s.ask(a.question, max_tokens=MAX_TOKENS)).strip()
            yield {**base, **_ask_fields(a), **read, **_scored(answer, a, facts_of), "focus_refused": str(e),
                   "answer_seconds": round(time.perf_counter() - t0, 2)}
            continue
        whole = max(s.source_map.end_char, 1)
        where = {"focus_spans": [[round(w.start / whole, 4), round(w.end / whole, 4)] for w in text.windows],
                 "focus_ranked": _ranked(s, located, a), "locate_seconds": round(locate_seconds, 2)}
        yield {**base, **_ask_fields(a), **read, **where,
               **_focused(facts, name, focused, text, located, a, t0, facts_of)}


def _ask_fields(a) -> dict:
    return {"id": a.id, "task": a.task, "heldout": a.heldout, "target_depth": a.target_depth, "depth": a.depth,
            "question": a.question, "reference": a.refs[0] if a.refs else "", "kind": a.kind}
