"""The rows of logits a context reserves (llama_context_params.n_outputs_max, kvpot.runtime.outputs).

llama.cpp sizes its compute buffer at context creation for the output head on n_outputs_max rows of a
step, the whole step (n_batch) when it is left at 0. The reserved size is read from llama.cpp's own log
line ("compute buffer size = N MiB", every device's summed) through kvpot's log file; the reference is a
context made the same way with the field left at 0, in the same test.

The buffer holds the larger of the head's rows and the rest of the graph (attention, feed-forward), so
reserving k rows instead of n_batch saves (n_batch - k) x n_vocab x 4 bytes, short by at most what the
rest of the graph needs (the whole buffer of a one-row context) and over by at most the hidden states
of the rows no longer carried to the head.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from potlib import logbook_tokens, pot_logprobs

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_model_facts
from kvpot.runtime import logs
from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.outputs import MARKED_ROWS, logprob_block_rows, outputs_max
from kvpot.session.auto_budget import (
    MARGIN_MIN,
    DeviceMemory,
    compute_bytes,
    global_kv_bytes_per_cell,
    plan_cells,
    scores_bytes_per_cell,
    window_kv_bytes,
)

N_BATCH = 512
N_CTX = 1024
F32 = 4
MiB = 1 << 20
LOGGED = 0.005 * MiB  # llama.cpp logs the size in MiB to two decimals
# hidden states per row alive beside the logits at the head (the final norm's input and output, f32), with
# room for two more copies
HIDDEN_COPIES = 4


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-log") / "llama.log"
    before = logs.path()
    logs.install(path)
    yield path
    logs.install(before or "")


def reserved(model, log_path, n_outputs_max: int, flash_attn: bool = False) -> tuple[LlamaContext, int, str]:
    """A context and the compute buffer llama.cpp reserved for it, in bytes, with its creation log."""
    start = log_path.stat().st_size if log_path.exists() else 0
    ctx = LlamaContext(model, ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, flash_attn=flash_attn,
                                            n_outputs_max=n_outputs_max))
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    sizes = [float(m) for m in re.findall(r"compute buffer size = +([0-9.]+) MiB", text)]
    assert sizes, "llama.cpp logged no compute buffer size for the context"
    return ctx, round(sum(sizes) * MiB), text


KVPOT_ROWS = {"last row": outputs_max(N_BATCH, logprobs=False), "NuC": outputs_max(N_BATCH, logprobs=True)}


@pytest.mark.parametrize("rows", KVPOT_ROWS, ids=list(KVPOT_ROWS))
@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_the_buffer_shrinks_by_the_rows_not_reserved(name, rows, request, log_path):
    model = request.getfixturevalue(name)
    k = KVPOT_ROWS[rows]
    assert k == (1 if rows == "last row" else MARKED_ROWS + logprob_block_rows(N_BATCH))
    n_embd = read_model_facts(model.path).n_embd
    ctx, unset, _ = reserved(model, log_path, 0)
    ctx.close()
    ctx, one, _ = reserved(model, log_path, 1)
    ctx.close()
    ctx, got, text = reserved(model, log_path, k)
    ctx.close()
    # the field reached llama.cpp in its place in the struct (it logs what it took)
    assert re.search(rf"n_outputs_max += {k}\b", text), text
    saved = unset - got
    expected = (N_BATCH - k) * model.n_vocab * F32
    rest = one  # everything but the head's rows, with one row of them
    assert got >= k * model.n_vocab * F32  # the reserve holds the rows asked for
    assert expected - rest - 2 * LOGGED <= saved <= expected + HIDDEN_COPIES * N_BATCH * n_embd * F32 + 2 * LOGGED, \
        (saved / MiB, expected / MiB, rest / MiB)


@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_where_the_head_is_the_peak_the_saving_is_the_rows(name, request, log_path):
    """Half the step's rows reserved, flash attention on (no scores over the cells): the head's rows are the
    largest part of both buffers, and the saving is their bytes up to the rows' hidden states."""
    model = request.getfixturevalue(name)
    k = N_BATCH // 2
    n_embd = read_model_facts(model.path).n_embd
    ctx, unset, _ = reserved(model, log_path, 0, flash_attn=True)
    ctx.close()
    ctx, one, _ = reserved(model, log_path, 1, flash_attn=True)
    ctx.close()
    ctx, half, _ = reserved(model, log_path, k, flash_attn=True)
    ctx.close()
    assert k * model.n_vocab * F32 > one  # the precondition: the head's rows outweigh the rest of the graph
    expected = (N_BATCH - k) * model.n_vocab * F32
    slack = HIDDEN_COPIES * (N_BATCH - k) * n_embd * F32 + 2 * LOGGED
    assert abs((unset - half) - expected) <= slack, ((unset - half) / MiB, expected / MiB)


@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_the_rows_kvpot_asks_for_are_unchanged(name, request, log_path):
    """The last row's logits and NuC's per-row log-probs from a context that reserves only what kvpot
    asks for equal those of a context that reserves the whole step, bit for bit: the reserve sizes the
    buffer, the graph computed is the same."""
    model = request.getfixturevalue(name)
    toks = logbook_tokens(model, 40, 3, N_BATCH + 1)
    batch, targets = toks[:N_BATCH], toks[1:N_BATCH + 1]

    def run(n_outputs_max: int):
        ctx = LlamaContext(model, ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, n_outputs_max=n_outputs_max))
        ctx.decode(batch[:-7], 0, logits="last")
        last = ctx.logits_last()
        ctx.close()
        ctx = LlamaContext(model, ContextParams(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, n_outputs_max=n_outputs_max))
        lp, lp_last = pot_logprobs(ctx, batch, targets)
        return last, lp, lp_last

    want = run(0)
    got_last = run(outputs_max(N_BATCH, logprobs=False))
    got_nuc = run(outputs_max(N_BATCH, logprobs=True))
    for got in (got_last, got_nuc):
        for a, b in zip(got, want):
            assert np.isfinite(a).all()
            assert np.array_equal(a, b)


def test_a_decode_that_marks_more_rows_is_refused_in_python(smol):
    """llama.cpp asserts (the process aborts) on a batch that marks more rows than n_outputs_max: the
    wrapper refuses it first with one line, and the context goes on."""
    toks = logbook_tokens(smol, 12, 5, 40)
    ctx = LlamaContext(smol, ContextParams(n_ctx=256, n_batch=64, n_threads=2, n_outputs_max=4))
    assert ctx.n_outputs_max == 4
    ctx.decode(toks[:4], 0, logits="all")  # as many as it holds
    with pytest.raises(KvpotError, match=r"asks for the logits of 5 rows; this context holds at most 4") as e:
        ctx.decode(toks[4:9], 4, logits="all")
    assert "\n" not in str(e.value)
    ctx.decode(toks[4:20], 4, logits="last")
    assert np.isfinite(ctx.logits_last()).all()
    ctx.close()
    with pytest.raises(KvpotError, match="negative"):
        LlamaContext(smol, ContextParams(n_ctx=256, n_batch=64, n_threads=2, n_outputs_max=-1))


def test_the_engine_reserves_what_its_policy_needs(smollm2_path):
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    for spec, logprobs in (("infinipot", True), ("infinipot:nuc_ratio=0", False), ("snapkv", False)):
        eng = Engine(str(smollm2_path), make_policy(spec), EngineConfig(budget=512, chunk=256))
        try:
            assert eng.ctx.n_outputs_max == outputs_max(256, logprobs) == (65 if logprobs else 1), spec
        finally:
            eng.close()


@pytest.mark.parametrize("name", ["smollm2_path", "gemma_path"])
def test_the_plan_moves_by_the_rows_not_reserved(name, request):
    """--budget auto's plan counts the rows the engine's context reserves: against a plan for llama.cpp's
    default (the whole step), its buffers are smaller by (chunk - k) x n_vocab x 4 bytes, the plan line
    says so, and it holds that many bytes' worth of cells more."""
    facts = read_model_facts(request.getfixturevalue(name))
    per_cell = global_kv_bytes_per_cell(facts) + scores_bytes_per_cell(facts, N_BATCH, flash_attn=False)
    for rows, logprobs in ((1, False), (N_BATCH, True)):
        k = outputs_max(N_BATCH, logprobs)
        delta = (N_BATCH - k) * facts.n_vocab * F32
        ours = compute_bytes(facts, 0, N_BATCH, rows)
        stock = compute_bytes(facts, 0, N_BATCH, rows, reserved_rows=N_BATCH)
        assert stock - ours == delta
        # a device where the plan for llama.cpp's default holds about 1,000 cells, below the trained context
        free = MARGIN_MIN + facts.file_bytes + window_kv_bytes(facts, N_BATCH) + stock + 1000 * per_cell
        mem = DeviceMemory(free, "RAM")
        a = plan_cells(facts, mem, N_BATCH, rows)
        b = plan_cells(facts, mem, N_BATCH, rows, reserved_rows=N_BATCH)
        assert b.cells < a.cells < facts.n_ctx_train, (a.cells, b.cells)
        assert a.cells - b.cells in (delta // per_cell, delta // per_cell + 1)
        buffers = [float(m.replace(",", "")) for m in re.findall(r"([0-9,.]+) MiB buffers", a.reason + b.reason)]
        assert len(buffers) == 2 and abs((buffers[1] - buffers[0]) * MiB - delta) <= MiB  # rounded to whole MiB
