"""`kvpot bench ...`: measurements beside stock llama.cpp in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from kvpot.api.engine_plan import plan_engine
from kvpot.api.plan import check_adapters, check_policy
from kvpot.bench.report import context_table, heatmap_png, niah_table, ppl_table, throughput_table
from kvpot.bench.throughput import ThroughputPlan, read_checkpoint_path, run_meta, run_plan
from kvpot.errors import KvpotError
from kvpot.models.registry import DEFAULT_MODEL
from kvpot.models.resolve import resolve_model
from kvpot.paths import bench_reads_dir
from kvpot.safe_write import atomic_write, protect, resolve_target
from kvpot.session.settings import setting_problem

from ._common import at_most_every, err, steps, user_errors
from ._options import ADVANCED, KvpotGroup, aliased

READ_LINE_EVERY_S = 60.0  # in a log, a line a minute of how far a reading is (one past the window takes up to an hour)

app = typer.Typer(cls=KvpotGroup, help="Benchmarks, each reported as a ratio to stock llama.cpp measured in the same run.",
                  no_args_is_help=True)


# -n was input lengths here; across kvpot it is now the answer's tokens (llama.cpp's -n/--n-predict)
@app.command(cls=aliased({"-n": "--tokens"}))
@user_errors
def throughput(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    policy: str = typer.Option("streaming", "--policy", "-P", metavar="SPEC", help="policy spec (docs/methods.md)"),
    budget: int = typer.Option(1024, "--budget", "-b", min=1, help="cells the pot keeps"),
    tokens: list[int] = typer.Option([32768], "--tokens", min=64, help="input lengths to read; repeatable"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                 help="also write the results here, rewritten as each part ends"),
    chunk: int = typer.Option(512, "--chunk", min=16, rich_help_panel=ADVANCED,
                              help="tokens per decode step (also stock's n_batch)"),
    stock_tokens: int = typer.Option(None, "--stock-tokens", min=64, show_default="what fits",
                                     rich_help_panel=ADVANCED, help="stock prefill length"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, rich_help_panel=ADVANCED, help="CPU threads"),
    flash_attn: bool = typer.Option(False, "--flash-attn/--no-flash-attn", rich_help_panel=ADVANCED,
                                    help="flash attention on both sides"),
    decode: int = typer.Option(32, "--decode", min=0, rich_help_panel=ADVANCED,
                               help="answer tokens timed after each read (0: none)"),
    resume: bool = typer.Option(False, "--resume", rich_help_panel=ADVANCED,
                                help="keep --json's parts, go on from a save"),
    save_every: float = typer.Option(600.0, "--save-every", min=0.0, metavar="SECONDS", rich_help_panel=ADVANCED,
                                     help="save reads this often (0: each chunk)"),
    upstream: bool = typer.Option(True, "--upstream/--no-upstream", rich_help_panel=ADVANCED,
                                  help="read unpatched llama.cpp too (the ratios' reference)"),
) -> None:
    """Ingest N tokens of generated text with a policy; report tokens/s, peak RSS and pot bytes beside stock prefill, then the answer tokens/s after each read (--decode) and its ratio to the shortest input's.

    --decode asks a short question after each read and times that many greedy answer tokens. --flash-attn is off by default, as `kvpot ask` reads where the device holds the model's window (llama.cpp's own -fa auto turns it on for a CPU).

    A read of hours can stop (Ctrl-C, a session's end) and go on: with --json the parts done are written as they end and each read is saved every --save-every seconds; --resume keeps them and goes on from the last save (while a read is still to do, parts measured on another CPU are measured again). A read in parts reports its reading time summed and the largest part's peak RSS."""
    # a bad spec, an impossible budget or a foreign adapter is refused before any process starts, at the longest
    # read (IMDC's smallest step shrinks as the input grows); each worker plans its read's engine alike
    facts = plan_engine(model, policy, budget, chunk, threads, flash_attn=flash_attn,
                        expected_tokens=max(tokens)).facts
    _outputs_checked({facts.path: "the model"}, json_out)
    fits = min(max(tokens), facts.n_ctx_train or max(tokens))
    plan = ThroughputPlan(model=str(facts.path), policy=policy, budget=budget, chunk=chunk, threads=threads,
                          flash_attn=flash_attn, pot_tokens=tuple(tokens), stock_tokens=stock_tokens or fits,
                          decode=decode, upstream=upstream)
    done = _load_throughput(json_out, plan) if resume else None
    saves = bench_reads_dir() if json_out else None
    if saves is not None and not resume:  # a fresh run reads from token 0
        from kvpot.bench.read_checkpoint import drop as drop_read_save

        for n in plan.pot_tokens:
            drop_read_save(read_checkpoint_path(saves, plan, n))
    try:
        with steps("benchmarking") as status:
            result = run_plan(plan, say=lambda msg: status.update(msg), done=done,
                              on_part=(lambda r: _write_json(json_out, r)) if json_out else None,
                              checkpoints=saves, save_every=save_every, on_progress=err.print)
    except KeyboardInterrupt:
        if json_out:  # what was done is kept: say how to go on from it
            err.print(f"the parts done are in {json_out}; the same command with --resume goes on "
                      f"(a read from its last save)")
        raise
    err.print(throughput_table(result, facts.name))
    if json_out:
        _write_json(json_out, result)
        err.print(f"results written to {json_out}")


def _load_throughput(path: Path | None, plan: ThroughputPlan) -> dict | None:
    """The parts of `plan` a `bench throughput --json` file holds already (None: none yet); refused when it
    was written for another plan (another model file, policy, budget, chunk, threads or decode)."""
    if path is None:
        raise KvpotError("--resume needs --json PATH (the file holding the parts already run)")
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        assert isinstance(data, dict) and isinstance(data["plan"], dict) and isinstance(data["pot"], list)
        assert isinstance(data["stock"], dict) and all(isinstance(r, dict) and "tokens" in r for r in data["pot"])
    except (ValueError, AssertionError, KeyError):
        raise KvpotError(f"{path} is not a `bench throughput` results file; remove it or drop --resume") from None
    # the model by its file's name: the registry's file in another kvpot home is the same model
    want = plan.__dict__ | {"pot_tokens": None, "model": Path(plan.model).name}
    had = data["plan"] | {"pot_tokens": None, "model": Path(str(data["plan"].get("model"))).name}
    had.setdefault("upstream", True)  # a file from before the unpatched part: resumed, that part is measured
    differs = [k for k in want if had.get(k) != want[k]]
    if differs:
        k = differs[0]
        raise KvpotError(f"{path} was written with {k} {had.get(k)!r}, not {want[k]!r}; "
                         f"write to another file or drop --resume")
    return data


@app.command(cls=aliased({"-n": "--length"}))
@user_errors
def niah(
    model: str = typer.Option("gemma3-270m", "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    policy: list[str] = typer.Option(["infinipot"], "--policy", "-P", metavar="SPEC",
                                     help="policy specs to compare; repeatable"),
    lengths: list[int] = typer.Option([8192], "--length", min=256, help="haystack lengths in tokens (repeatable)"),
    depths: list[float] = typer.Option([0.1, 0.5, 0.9], "--depth", "-d", min=0.0, max=1.0, help="needle depths (repeatable)"),
    seeds: list[int] = typer.Option([0], "--seed", help="seeds: each draws another key (repeatable)"),
    budget: int = typer.Option(1024, "--budget", "-b", min=1, help="cells kept by budget-driven policies"),
    chunk: int = typer.Option(512, "--chunk", min=16, help="tokens per step"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                  help="write every case here as JSON (rewritten after each case)"),
    resume: bool = typer.Option(False, "--resume", help="keep the cases already in --json and run only the missing ones"),
    png_out: Path = typer.Option(None, "--png", show_default="not drawn", help="write an accuracy heatmap (length x depth per policy) here"),
    task: str = typer.Option("multikey", "--task", help="multikey, prose or passkey (see above)"),
    sources: bool = typer.Option(False, "--sources", help="also record whether the top source is the needle"),
) -> None:
    """Needle retrieval over a grid of lengths x depths x policies x seeds (plain completion prompt).

    `-P full` reads each haystack whole with full attention (stock llama.cpp's computation). Tasks: multikey, four access codes in varied prose, the question names one (RULER); prose, one code in that prose; passkey, one key in a repeated filler sentence. --sources ranks the passages each answer drew on, as `kvpot ask --sources` does, and records whether the top one is the needle (source_hit, source_rank); with --resume, cases recorded without them run again."""
    from kvpot.bench.grid import niah_grid, niah_plans
    from kvpot.bench.niah import TASKS

    if task not in TASKS:
        raise KvpotError(f"--task must be one of {', '.join(TASKS)}, got {task!r}")
    # a bad spec, an impossible budget or a foreign adapter, before any haystack is read
    plans = niah_plans(model, policy, budget, chunk, threads, max(lengths))
    facts = plans[0].facts
    _outputs_checked({facts.path: "the model"}, json_out, png_out)
    total = len(policy) * len(lengths) * len(depths) * len(seeds)
    previous = [r for r in _load_cases(json_out) if r.get("task", "passkey") == task] if resume else []
    if resume and json_out.exists() and len(previous) != len(_load_cases(json_out)):
        raise KvpotError(f"{json_out} holds cases of another task; write --task {task} to another file")
    from kvpot.bench.grid import case_key

    grid = {(task, p, n, d, s) for p in policy for n in lengths for d in depths for s in seeds}
    if sources:  # a case of this grid recorded without --sources is run again, with them
        previous = [r for r in previous if r.get("source_hit") is not None or case_key(r) not in grid]
    results: list[dict] = list(previous)

    def done() -> int:  # this grid's cases run so far (the file may hold other grids' cases too)
        return sum(case_key(r) in grid for r in results)

    with steps(f"{done()}/{total} cases") as status:
        on_case = _recorder(results, json_out, status, lambda r: (
            f"{done()}/{total} cases; last: {r['policy']} {r['length']} @ {r['depth']}: "
            f"{'found' if r['correct'] else 'missed'}"))
        results = niah_grid(plans, facts.name, lengths, depths, seeds, on_case=on_case, done=previous, task=task,
                            sources=sources, say=lambda m: status.update(f"case {done() + 1}/{total}: {m}"),
                            on_read=_reading_lines(status))
    err.print(niah_table(results, facts.name, task, policy, lengths, depths, sources=sources))
    if json_out:
        _write_json(json_out, results)
    if png_out:
        heatmap_png(results, png_out)
        err.print(f"heatmap written to {png_out}")



@app.command(cls=aliased({}))  # readable labels and every default in --help, as every kvpot command
@user_errors
def qa(
    models: list[str] = typer.Option(["qwen2.5-coder-1.5b"], "--model", "-m", metavar="MODEL",
                                     help="model names or .gguf paths; repeatable"),
    policy: list[str] = typer.Option(["full", "default"], "--policy", "-P", metavar="SPEC",
                                     help="policy specs, default (as `kvpot ask`) or none (no document); repeatable"),
    lengths: list[int] = typer.Option([8192, 32768], "--length", min=512, help="input lengths in tokens (repeatable)"),
    sample: int = typer.Option(8, "--sample", min=1, help="questions asked at lengths past 32K"),
    limit: int = typer.Option(None, "--limit", min=1, show_default="all", help="questions asked at every length"),
    seed: int = typer.Option(0, "--seed", help="draws the inputs: documents, order, depths"),
    budget: int = typer.Option(None, "--budget", "-b", min=1, show_default="as `kvpot ask`",
                               help="cells kept by pot policies"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    per_question: bool = typer.Option(False, "--per-question", rich_help_panel=ADVANCED,
                                      help="read each input again per question"),
    multikey: bool = typer.Option(True, "--multikey/--no-multikey", rich_help_panel=ADVANCED,
                                  help="also ask for a hidden access code"),
    question_before: bool = typer.Option(False, "--question-before", rich_help_panel=ADVANCED,
                                         help="the question before the document too"),
    focus: bool = typer.Option(False, "--focus", rich_help_panel=ADVANCED,
                               help="answer from a focused read, as `kvpot ask`"),
    locator: str = typer.Option(None, "--locator", metavar="HOW", rich_help_panel=ADVANCED,
                                show_default="none",
                                help="read once, each question focused as chat does"),
    closed_book: bool = typer.Option(True, "--closed-book/--no-closed-book", rich_help_panel=ADVANCED,
                                     help="also ask every question with no document first"),
    only: list[str] = typer.Option(None, "--only", metavar="ID", show_default="every question",
                                   rich_help_panel=ADVANCED, help="ask only these questions (ids as in the JSON)"),
    kinds: list[str] = typer.Option(None, "--kind", metavar="KIND", show_default="every kind", rich_help_panel=ADVANCED,
                                    help="ask only questions of this kind; repeatable"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                  help="write every case here, rewritten after each case"),
    resume: bool = typer.Option(False, "--resume", help="keep the cases in --json, run only the missing ones"),
    save_every: float = typer.Option(600.0, "--save-every", min=0.0, metavar="SECONDS", rich_help_panel=ADVANCED,
                                     help="save readings this often (0: each chunk)"),
) -> None:
    """Answer quality on real documents: questions over licence texts, man pages, package documentation and Python's library, each in an input of other documents at a varied depth (docs/benchmarks.md).

    `-P full` reads each input whole with full attention (the reference, where the input fits); `-P none` asks each question with no document (closed book: right answers a reading must beat). --closed-book (on by default) asks every question that way first, and each case records that verdict (closed_book_correct) beside its own.

    --per-question: pot policies read each input again per question, with the question known first (CaP-Q, as `kvpot ask`), instead of one read per input; --question-before (with --per-question) puts it before the document too, as `kvpot ask --question-before on` (a full attention read per question too); --focus (with --per-question) answers from a focused read of the passages the pot's own answer drew on, and each case records the pot's answer too (pot_answer, pot_correct); --locator HOW reads each input once and answers each question from a focused read of the passages HOW locates, as `kvpot chat` past the pot. --multikey hides four access codes in each input and asks for one. --only takes ids as in the JSON (multikey-N for input N's access code), --kind the kinds of questions to ask (lexical, paraphrase, two-passage, whole, absent, multikey); the inputs stay the ones the whole set builds.

    A reading past the window takes an hour or more on 2 cores: with --json it is saved as it goes (every --save-every seconds), and Ctrl-C or SIGTERM stop it after a save, to go on with --resume from its last save."""
    from kvpot.bench.qa import CLOSED, DEFAULT, Plan, case_key, run
    from kvpot.bench.qa_questions import load_set
    from kvpot.bench.qa_read_save import QaReadStopped, QaSaves
    from kvpot.bench.qa_report import KINDS, kinds_table, qa_table

    from ._interrupt import Interrupts

    if question_before and not per_question:
        raise KvpotError("--question-before needs --per-question (the question must be known before reading)")
    if locator is not None:
        problem = setting_problem("locator", locator)
        if problem:
            raise KvpotError(f"--locator {problem}")
        if per_question:
            raise KvpotError("--locator answers every question from one read (as kvpot chat); leave out --per-question")
        focus = True
    if focus and not per_question and locator is None:
        raise KvpotError("--focus needs --per-question (the question must be known before reading), or --locator")
    bad = sorted(set(kinds or ()) - {*KINDS, "multikey"})
    if bad:
        raise KvpotError(f"--kind: no kind {', '.join(bad)} (kinds: {', '.join(KINDS)}, multikey)")
    for spec in policy:
        if spec not in (DEFAULT, CLOSED):
            try:
                check_policy(spec)  # a bad spec, before any model loads
            except KvpotError as e:
                raise KvpotError(f"{e}; bench qa also takes {DEFAULT} (what --budget auto reads with) "
                                 f"and {CLOSED} (closed book)") from None
            if budget:
                check_policy(spec, budget)
    paths = []
    for m in models:
        facts, _ = resolve_model(m)
        for spec in policy:
            if spec not in (DEFAULT, CLOSED):
                check_adapters(spec, facts.path)
        paths.append(facts.path)
    _outputs_checked(dict.fromkeys(paths, "the model"), json_out)
    qset = load_set()
    if qset.notice():
        err.print(f"[yellow]questions {qset.notice()}[/yellow]")
    if not qset.questions:
        raise KvpotError("no question of the set can be asked on this machine")
    previous = _load_cases(json_out, ("model", "policy", "length", "seed", "id"), "`bench qa`") if resume else []
    results: list[dict] = list(previous)

    saves = QaSaves(bench_reads_dir(), save_every, resume) if json_out else None
    # a first Ctrl-C, SIGTERM or SIGHUP stops the reading in progress, which is saved; a second ends at once
    with Interrupts(terminate=True) as interrupts, steps(f"{len(previous)} cases already run") as status:
        record = _recorder(results, json_out, status, lambda r: (
            f"{len(results)} cases; last: {r['policy']} {r['length']} {r['id']}: "
            f"{'skipped' if 'skipped' in r else 'right' if r['correct'] else 'wrong'}"))

        def on_case(r: dict) -> None:
            # run() asks again only what was asked with another prompt: the new answer replaces it
            results[:] = [x for x in results if case_key(x) != case_key(r)]
            record(r)
        try:
            for m in models:
                plan = Plan(model=m, policies=policy, lengths=lengths, seed=seed, sample=sample, limit=limit,
                            threads=threads, budget=budget, per_question=per_question, multikey=multikey,
                            only=tuple(only or ()), kinds=tuple(kinds or ()), question_before=question_before, focus=focus,
                            locator=locator,
                            closed_book=closed_book)
                run(plan, qset.questions, done=[r for r in results], on_case=on_case, say=status.update,
                    on_read=_reading_lines(status), saves=saves, stop=lambda: interrupts.hit)
        except QaReadStopped as e:
            _say_stopped(e, json_out)
            interrupts.end_if_terminated()
            raise KeyboardInterrupt from None
    err.print(qa_table(results))
    if (by_kind := kinds_table(results)) is not None:
        err.print(by_kind)
    if json_out:
        _write_json(json_out, results)
        err.print(f"results written to {json_out}")


@app.command(cls=aliased({}))
@user_errors
def ruler(
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    policy: list[str] = typer.Option(["full", "default"], "--policy", "-P", metavar="SPEC",
                                     help="policy specs or default (as `kvpot ask`); repeatable"),
    lengths: list[int] = typer.Option([8192, 32768, 131072], "--length", min=512,
                                      help="document lengths in tokens (repeatable)"),
    samples: int = typer.Option(10, "--samples", min=1, help="samples per task and length"),
    tasks: list[str] = typer.Option(None, "--task", metavar="TASK", show_default="all",
                                    help="the RULER tasks to run; repeatable"),
    budget: int = typer.Option(None, "--budget", "-b", min=1, show_default="as `kvpot ask`",
                               help="cells kept by pot policies"),
    seed: int = typer.Option(0, "--seed", help="draws the samples"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    closed_book: bool = typer.Option(True, "--closed-book/--no-closed-book", rich_help_panel=ADVANCED,
                                     help="also ask the QA questions with no document"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                  help="write every case and the summary here, rewritten after each case"),
    resume: bool = typer.Option(False, "--resume", help="keep the cases already in --json and run only the others"),
) -> None:
    """RULER's tasks (arXiv 2404.06654) generated offline: needles, variable tracking, common and frequent words, QA on kvpot's question set; each document read once per policy and budget, all its questions asked after the read, scored with RULER's metric (kvpot/bench/ruler.py says where kvpot differs)."""
    from kvpot.bench.ruler import TASKS
    from kvpot.bench.ruler_run import RulerPlan, check_plan, document, lines, load, run, run_record

    plan = RulerPlan(model=model, policies=list(policy), lengths=list(lengths), tasks=list(tasks or TASKS),
                     samples=samples, seed=seed, budget=budget, threads=threads, closed_book=closed_book)
    check_plan(plan)
    facts, _ = resolve_model(model)
    for spec in policy:
        if spec != "default":
            check_policy(spec, model_path=facts.path)
    _outputs_checked({facts.path: "the model"}, json_out)
    if resume and json_out is None:
        raise KvpotError("--resume needs --json PATH (the file holding the cases already run)")
    runs, previous = load(json_out) if resume else ([], [])
    runs = [*runs, run_record(plan)]
    results: list[dict] = list(previous)
    with steps(f"{len(previous)} cases already run") as status:
        def on_case(r: dict) -> None:
            results.append(r)
            if json_out:
                _write_json(json_out, document(runs, results))
            status.update(f"{len(results)} cases; last: {r['policy']} {r['length']} {r['id']}: "
                          f"{'skipped' if 'skipped' in r else r['score']}")
        results = run(plan, done=list(previous), on_case=on_case, say=status.update, on_read=_reading_lines(status))
    typer.echo("\n".join(lines(document(runs, results)["summary"])))
    if json_out:
        _write_json(json_out, document(runs, results))
        err.print(f"results written to {json_out}")


@app.command("qa-rescore", cls=aliased({}))
@user_errors
def qa_rescore(
    files: list[Path] = typer.Argument(..., metavar="JSON...", help="`bench qa` or `bench niah` JSON files"),
    write: bool = typer.Option(True, "--write/--dry-run", help="write the strict verdicts into the files"),
) -> None:
    """Score the answers benchmark JSON files hold again, strictly (the reference and no competing answer), the old verdict kept beside it; prints old against strict per file."""
    from kvpot.bench.qa_rescore import rescore, summary_lines
    from kvpot.bench.qa_rescore import write as write_rescored

    for f in rescore(files):
        typer.echo("\n".join(summary_lines(f)))
        if write and f.cases:
            write_rescored(f)


@app.command(cls=aliased({}))
@user_errors
def locate(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    length: int = typer.Option(32768, "--length", min=512, help="tokens of each joined input"),
    budget: int = typer.Option(2048, "--budget", "-b", min=1, help="cells kept by the policy"),
    policy: str = typer.Option("infinipot", "--policy", "-P", metavar="SPEC", help="the policy that reads each input"),
    inputs: int = typer.Option(None, "--inputs", min=1, show_default="all", help="read the first N inputs"),
    heldout: bool = typer.Option(False, "--heldout/--no-heldout", help="the held-out questions, not the tuning ones"),
    pot: bool = typer.Option(True, "--pot/--no-pot", help="also the pot's locator (an answer per question: slower)"),
    bm25_lines: list[int] = typer.Option(None, "--bm25-lines", min=1, rich_help_panel=ADVANCED, show_default="none",
                                         help="also bm25 and mix over passages of this many lines; repeatable"),
    seed: int = typer.Option(0, "--seed", help="draws the inputs, as bench qa's --seed"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    json_out: Path = typer.Option(None, "--json", show_default="not written", help="write every question here, "
                                  "rewritten after each input"),
    resume: bool = typer.Option(False, "--resume", help="keep the inputs --json holds, read only the others"),
) -> None:
    """How well each locator (keys, bm25, mix, pot) finds a question's passages after one read: ranks, hit@focus and seconds per kind of question."""
    from kvpot.bench.locate import LocatePlan
    from kvpot.bench.locate import main as locate_main

    check_policy(policy, budget)  # each input's reading is planned as chat plans one (kvpot.api.plan.plan_read)
    if resume and json_out is None:
        raise KvpotError("--resume needs --json PATH (the file holding the inputs already read)")
    facts, _ = resolve_model(model)
    _outputs_checked({facts.path: "the model"}, json_out)
    locate_main(LocatePlan(model=model, length=length, budget=budget, policy=policy, threads=threads, heldout=heldout,
                           pot=pot, inputs=inputs, seed=seed, bm25_lines=list(bm25_lines or []), resume=resume),
                json_out)


@app.command(cls=aliased({}))
@user_errors
def route(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="MODEL", help="the model whose tokenizer sizes the inputs"),
    length: list[int] = typer.Option([32768, 65536, 131072], "--length", min=512, help="tokens of each joined input; repeatable"),
    seed: int = typer.Option(0, "--seed", help="draws the inputs, as bench qa's --seed"),
    json_out: Path = typer.Option(None, "--json", show_default="not written", help="write every question's routing here"),
) -> None:
    """Which questions the bm25 and mix locators send to the pot (about the whole input) rather than to a focused read."""
    from kvpot.bench.route import lines, run

    facts, _ = resolve_model(model)
    _outputs_checked({facts.path: "the model"}, json_out)
    out = run(model, sorted(set(length)), seed, json_out, say=lambda m: err.print(m, markup=False))
    typer.echo("\n".join(lines(out)))


def _say_stopped(e, json_out: Path | None) -> None:
    """Where a stopped `bench qa` is, and how it goes on."""
    if e.saved is not None:
        err.print(f"stopped {e.what} after {e.tokens:,} tokens; saved at {e.saved}: the same command with --resume "
                  f"goes on from there", soft_wrap=True, markup=False)
    else:
        why = ("it was not saved (saves need --json)" if json_out is None else
               "nothing of it was saved (it had read nothing yet, or its policy keeps data on disk)")
        err.print(f"stopped {e.what} after {e.tokens:,} tokens; {why}", soft_wrap=True, markup=False)
    if json_out is not None:
        err.print(f"the cases done are in {json_out}", soft_wrap=True, markup=False)


def _reading_lines(status):
    """Where a grid's reading is told how far it got after every chunk: the status line in a terminal,
    a line a minute in a log."""
    return status.update if err.is_terminal else at_most_every(READ_LINE_EVERY_S, status.update)


def _recorder(results: list[dict], json_out: Path | None, status, describe):
    """A grid's on_case: keep the case, stamped with how it was made (`recorded`: the command, kvpot's commit,
    the CPU, the load at the start; a resumed grid's cases keep their own run's), rewrite --json after every
    case (so a long grid survives an interruption: --resume), and show the case on the status line."""
    made = run_meta()

    def on_case(r: dict) -> None:
        r.setdefault("recorded", made)
        results.append(r)
        if json_out:
            _write_json(json_out, results)
        status.update(describe(r))
    return on_case


def _outputs_checked(reads: dict[Path, str], *outputs: Path | None) -> None:
    """Refuse, before any reading, an output path (--json, --png) that could not be written or that names a
    file this command reads (`reads`: path -> what it is): a bench of hours must not fail at its first
    write, nor replace the model it measures."""
    for path, role in reads.items():
        protect(path, role)
    for out in outputs:
        if out is not None:
            resolve_target(out, "results")


def _write_json(path: Path, data) -> None:
    # flushed to disk before it replaces the last write: a part of a read of hours must survive a power cut
    with atomic_write(path, "results") as f:
        f.write(json.dumps(data, indent=1).encode())


def _load_cases(path: Path | None, fields=("policy", "length", "depth", "seed"), what: str = "niah") -> list[dict]:
    """The cases a grid's --json holds already (each a dict with `fields`), for --resume."""
    if path is None:
        raise KvpotError("--resume needs --json PATH (the file holding the cases already run)")
    if not path.exists():
        return []
    try:
        cases = json.loads(path.read_text())
        assert isinstance(cases, list) and all(isinstance(c, dict) and set(fields) <= set(c) for c in cases)
    except (ValueError, AssertionError):
        raise KvpotError(f"{path} is not a {what} results file; remove it or drop --resume") from None
    return cases


@app.command(cls=aliased({"--max-tokens": "--tokens"}))
@user_errors
def ppl(
    file: Path = typer.Option(..., "--file", "-f", help="a long text file"),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    policy: list[str] = typer.Option(["streaming"], "--policy", "-P", metavar="SPEC",
                                     help="policy specs to compare; repeatable"),
    budget: int = typer.Option(1024, "--budget", "-b", min=1, help="cells kept"),
    chunk: int = typer.Option(512, "--chunk", min=16, help="tokens per step"),
    max_tokens: int = typer.Option(None, "--tokens", min=64, show_default="the whole file",
                                   help="read at most this many tokens of the file"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                 help="also write the results here as JSON"),
) -> None:
    """Perplexity of a long text read under each policy (every token scored given the compressed past)."""
    from kvpot.bench.grid import ppl_plans, ppl_run
    from kvpot.ingest.textfile import read_document
    from kvpot.runtime.llama import LlamaModel

    # a bad spec, a budget it cannot honour, a missing or foreign adapter: said before any work
    plans = ppl_plans(model, policy, budget, chunk, threads)
    facts = plans[0].facts
    _outputs_checked({facts.path: "the model", file: "the input"}, json_out)
    text = read_document(file)
    lm = LlamaModel(str(facts.path))
    tokens = lm.tokenize(text)[: max_tokens or None]
    lm.close()
    results = []
    with steps("measuring") as status:
        for plan in plans:
            status.update(f"{plan.spec}: {len(tokens)} tokens")
            results.append(ppl_run(plan, tokens))
    err.print(ppl_table(results, facts.name, len(tokens), file.name))
    if json_out:
        _write_json(json_out, results)


@app.command(cls=aliased({"-n": "--tokens"}))
@user_errors
def context(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    tokens: list[int] = typer.Option([32768], "--tokens", min=256, help="document lengths in tokens; repeatable"),
    policy: str = typer.Option(None, "--policy", "-P", metavar="SPEC", show_default="as `kvpot ask`",
                               help="policy spec (docs/methods.md)"),
    budget: int = typer.Option(None, "--budget", "-b", min=1, show_default="the model's", help="cells kept"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    stock: bool = typer.Option(True, "--stock/--no-stock", help="also run stock llama.cpp where the document fits its context"),
    keep_files: Path = typer.Option(None, "--keep-files", file_okay=False, show_default="a temporary folder",
                                    help="keep the documents and saved contexts made here"),
    json_out: Path = typer.Option(None, "--json", show_default="not written",
                                 help="also write the results here as JSON"),
) -> None:
    """Time to the first answer token after reading N tokens, and reopening a saved context against reading the document again (`kvpot ask` with the model's default settings)."""
    import tempfile

    from kvpot.bench.context import run_lengths

    if policy:  # refuse a bad spec (or a budget it cannot work with) before any process starts
        check_policy(policy, budget)
    facts, _ = resolve_model(model)
    _outputs_checked({facts.path: "the model"}, json_out)
    with tempfile.TemporaryDirectory(prefix="kvpot-bench-") as tmp:
        out = keep_files or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        with steps("benchmarking") as status:
            results = run_lengths(model, tokens, out, threads, policy, budget, stock, say=status.update)
    err.print(context_table(results, facts.name))
    if json_out:
        _write_json(json_out, results)
        err.print(f"results written to {json_out}")
