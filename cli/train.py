"""`kvpot train ...`: train a method's parts for a model on this machine (torch: the `train` extra).
One subcommand per trained method; each writes an adapter GGUF (docs/formats.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from kvpot.api.plan import check_threads
from kvpot.errors import KvpotError
from kvpot.models.resolve import resolve_model

from ._common import err, user_errors
from ._options import KvpotCommand, KvpotGroup

app = typer.Typer(cls=KvpotGroup, help="Train a method's parts for a model from documents on this machine (needs torch: the train extra).",
                  no_args_is_help=True)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[note]}"), TimeRemainingColumn(), console=err, transient=False)


@app.command("locret", cls=KvpotCommand)
@user_errors
def locret(
    model: str = typer.Option(..., "--model", "-m", metavar="MODEL", help="a model name or a .gguf path"),
    out: Path = typer.Option(..., "--output", "-o", help="the adapter GGUF to write"),
    data: list[Path] = typer.Option(None, "--data", "-d", show_default="Python's library, /usr/share/doc",
                                    help="text files or folders to train on; repeatable"),
    samples: int = typer.Option(48, "--samples", min=1, help="training samples (prompt + answer)"),
    length: int = typer.Option(768, "--length", min=128, max=32768, help="tokens per sample"),
    steps: int = typer.Option(240, "--steps", min=1, help="optimiser steps (one sample each)"),
    hidden: int = typer.Option(32, "--hidden", min=1, max=4096, help="the heads' intermediate size d_R (paper: 1024)"),
    lr: float = typer.Option(2e-3, "--lr", min=0.0, help="peak learning rate (paper: 5e-4 over 3000 steps)"),
    seed: int = typer.Option(0, "--seed", help="seed of the samples, the initialisation and the sample order"),
    heldout: int = typer.Option(4, "--heldout", min=0, help="held-out samples for the rank correlation"),
    threads: int = typer.Option(2, "--threads", "-t", help="CPU threads (1 to the machine's cores)"),
    dtype: str = typer.Option("f16", "--dtype", help="f16 or f32 weights in the adapter"),
    cache: Path = typer.Option(None, "--cache", show_default="not kept",
                               help="keep the samples' features and labels here, for a rerun"),
) -> None:
    """Train Locret's retaining heads for MODEL and write them as an adapter GGUF.

    Features ([Q; K; V] before RoPE) and labels (the answer's largest pre-softmax score on each prompt token) come from the patched llama.cpp reading the samples; the fit uses torch. --data defaults to this Python's standard library and /usr/share/doc. --cache keeps about 40 MB a sample for SmolLM2, and a rerun reads them back (docs/locret.md).
    """
    from kvpot.converters.adapter import check_adapter_output
    from kvpot.train.locret import prepare_cache, train_locret
    from kvpot.train.locret_fit import FitConfig, import_torch

    if dtype not in ("f16", "f32"):
        raise KvpotError(f"--dtype must be f16 or f32, not {dtype!r}")
    check_threads(threads)
    check_adapter_output(out)
    cache = prepare_cache(cache)
    for d in data or []:
        if not d.expanduser().exists():
            raise KvpotError(f"--data {d} does not exist")
    if data:
        from kvpot.train.documents import list_files

        list_files(list(data))  # one line now for directories without text, not after the progress bars
    import_torch()
    facts, _ = resolve_model(model)
    check_adapter_output(out, inputs=(facts.path,))  # never over the model it reads
    cfg = FitConfig(hidden=hidden, steps=steps, lr=lr, seed=seed, threads=threads)
    with _progress() as progress:
        cap = progress.add_task("reading samples", total=samples + heldout, note="")
        fit = progress.add_task("training", total=steps, note="", start=False)

        def on_capture(i, s):
            progress.update(cap, completed=i + 1, note=f"{s.kind}, {len(s.tokens)} tokens")

        def on_step(step, loss):
            if step == 0:
                progress.start_task(fit)
            progress.update(fit, completed=step + 1, note=f"loss {loss:.4f}")

        report = train_locret(facts.path, out, sources=list(data or []) or None, n_samples=samples, length=length,
                              n_heldout=heldout, cfg=cfg, dtype=dtype, on_capture=on_capture, on_step=on_step,
                              cache=cache)
    err.print(f"{out}: retaining heads for {facts.name}, hidden {hidden}; loss {report.loss_before:.4f} -> "
              f"{report.loss_after:.4f} on {report.n_tokens} training tokens"
              + (f"; held-out Spearman {report.spearman:.3f}" if report.spearman is not None else ""))


@app.command("edgeinfinite", cls=KvpotCommand)
@user_errors
def edgeinfinite(
    model: str = typer.Option(..., "--model", "-m", metavar="MODEL", help="the base model: a name or a .gguf path"),
    out: Path = typer.Option(..., "--output", "-o", help="the memory-gate adapter GGUF to write"),
    steps: int = typer.Option(150, "--steps", help="optimizer steps (one document window each)"),
    seed: int = typer.Option(0, "--seed", help="seed of the data windows and torch"),
    l_sink: int = typer.Option(32, "--l-sink", help="sink tokens of a training window"),
    l_seg: int = typer.Option(128, "--l-seg", help="segment length of a training window"),
    n_seg: int = typer.Option(3, "--n-seg", help="segments per window (the last is trained on)"),
    l_window: int = typer.Option(0, "--l-window", help="with --l-chunk: tokens never folded (L_window)"),
    l_chunk: int = typer.Option(0, "--l-chunk", help="train as a text is read, a chunk this long (see above)"),
    budget: int = typer.Option(0, "--budget", help="with --l-chunk: train as the policy reads at this budget"),
    n_chunks: int = typer.Option(0, "--n-chunks", help="with --budget: chunks read before the trained one"),
    lr: float = typer.Option(1e-3, "--lr", help="Adam learning rate"),
    lr_g: float = typer.Option(0.0, "--lr-g", help="the gate logits g's own Adam rate (0: --lr)"),
    data: str = typer.Option("code", "--data", help="code or mixed (see above)"),
    threads: int = typer.Option(2, "--threads", "-t", help="torch CPU threads"),
) -> None:
    """Train EdgeInfinite's memory-gating module for MODEL (frozen backbone; LM loss on long offline text).

    --l-chunk N trains as a text is read: fold all n-seg segments, then train a chunk of N tokens that also sees L_window + a random leftover of unfolded tokens (0: train the last segment).

    --budget N (with --l-chunk) trains as `kvpot bench ppl --budget N --chunk L_CHUNK` reads, chunk by chunk with the policy's folds; the lengths come from the policy at that budget (--l-sink, --l-seg, --n-seg and --l-window are not used). The shipped gates were trained this way. --n-chunks 0 reads 2 x budget / l-chunk chunks before the trained one, so the trained chunk reads after at least two folds.

    --lr: the paper's 0.005 is for a 3B model over 100K samples; the shipped gates used 0.001 for SmolLM2 and 0.0001 with --lr-g 0.02 for Gemma-3 (docs/edgeinfinite.md). Adam moves g by about its rate a step, so at 0.001 the initial g = -4 barely opens.

    --data code: the Python standard library's long sources; mixed: those and Debian's licence texts (/usr/share/common-licenses) in turn.
    """
    from kvpot.converters.adapter import check_adapter_output
    from kvpot.train.edgeinfinite import TrainConfig, train

    check_threads(threads)
    check_adapter_output(out)
    if (steps < 0 or l_sink < 0 or l_seg < 2 or n_seg < (1 if l_chunk else 2) or lr <= 0 or l_window < 0
            or l_chunk < 0 or l_chunk == 1 or threads < 1 or budget < 0 or n_chunks < 0 or lr_g < 0):
        raise KvpotError("train edgeinfinite: needs steps >= 0, l-sink >= 0, l-seg >= 2, n-seg >= 2 (>= 1 with "
                         "--l-chunk), lr > 0, l-window >= 0, l-chunk 0 or >= 2, threads >= 1, budget >= 0, "
                         "n-chunks >= 0, lr-g >= 0")
    if (budget or n_chunks) and not l_chunk:
        raise KvpotError("train edgeinfinite: --budget and --n-chunks need --l-chunk (the chunk the engine reads)")
    if n_chunks and not budget:
        raise KvpotError("train edgeinfinite: --n-chunks needs --budget")
    if data not in ("code", "mixed"):
        raise KvpotError(f"train edgeinfinite: --data must be code or mixed, got {data!r}")
    facts, _ = resolve_model(model)
    check_adapter_output(out, inputs=(facts.path,))  # never over the model it reads
    cfg = TrainConfig(L_sink=l_sink, L_seg=l_seg, n_seg=n_seg, L_window=l_window, L_chunk=l_chunk,
                      budget=budget, n_chunks=n_chunks, steps=steps, lr=lr, lr_g=lr_g, data=data, seed=seed,
                      threads=threads)
    summary = train(facts.path, out, cfg, log=lambda s: err.print(s))
    if summary["steps"]:
        err.print(f"{out}: memory gate for {facts.name}, {summary['steps']} steps, "
                  f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}")
    else:  # --steps 0: the untrained gate (the ablation's gate=init, as a file), no loss to report
        err.print(f"{out}: untrained memory gate for {facts.name} (--steps 0)")
