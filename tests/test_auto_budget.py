"""`kvpot ask` with --budget auto (the default): an input that fits is read with full attention and
answers exactly as stock llama.cpp does in the same run; past the device's memory it goes through
the largest pot (for a model measured past the window, the pot that answered best there); `--policy
full` refuses an input that cannot fit before reading it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.models.gguf_file import read_model_facts
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.session.answer import AnswerText
from kvpot.session.auto_budget import MEMORY_ENV, DeviceMemory, logit_rows_held, plan_cells, pot_cells
from kvpot.session.beyond_window import Asking
from kvpot.session.prompting import CompletionFormat, question_suffix
from kvpot.session.session import answer_reserve
from kvpot.session.settings import RunSettings

runner = CliRunner()
OPTS = ["--model", "smollm2-135m", "--chunk", "256", "-n", "10", "--prompt-format", "completion", "--threads", "2"]


@pytest.fixture(scope="module")
def small_doc(tmp_path_factory, smollm2_path):
    text, question, _ = logbook(n_entries=24)  # about 1K tokens
    path = tmp_path_factory.mktemp("auto") / "logbook.txt"
    path.write_text(text)
    return path, text, question


def stock_answer(model_path, text: str, question: str, n: int, flash_attn: bool) -> str:
    """Stock llama.cpp, in this process: the whole prompt in one context (no kvpot call), greedy, with
    flash attention as kvpot's `auto` chose it for the device the test pretends to have."""
    model = LlamaModel(str(model_path))
    toks = model.bos() + model.tokenize(text) + model.tokenize("\n\n" + question_suffix(question))
    ctx = LlamaContext(model, ContextParams(n_ctx=len(toks) + n + 16, n_batch=256, n_threads=2,
                                            flash_attn=flash_attn))
    for s in range(0, len(toks), 256):
        ctx.decode(toks[s:s + 256], s, logits="last")
    out, pos = b"", len(toks)
    for _ in range(n):
        tok = int(np.argmax(ctx.logits_last()))
        if model.is_eog(tok):
            break
        out += model.piece(tok)
        ctx.decode([tok], pos, logits="last")
        pos += 1
    ctx.close()
    model.close()
    # shown as kvpot shows a completion answer (kvpot.session.answer, tested on its own): the tokens are stock's
    shown = AnswerText(stops=CompletionFormat.stop, one_line=True)
    return shown.feed(out.decode("utf-8", errors="replace")) + shown.finish()


def test_an_input_that_fits_is_read_with_full_attention_as_stock(small_doc, smollm2_path, monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, str(8 << 30))
    path, text, question = small_doc
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, "-v"])  # -v: the plan's reasons
    assert res.exit_code == 0, res.output
    assert "full attention, as stock llama.cpp" in res.stderr
    assert "flash attention on" not in res.stderr
    # 8 GiB holds SmolLM2's whole 8K window without flash attention: `auto` reads without it
    assert res.stdout.rstrip("\n") == stock_answer(smollm2_path, text, question, 10, flash_attn=False)


def test_past_the_device_memory_the_pot_takes_what_fits(small_doc, smollm2_path, monkeypatch):
    facts = read_model_facts(smollm2_path)
    # memory for about 1200 cells: the document (~1K tokens) with the answering room does not fit
    # a cell's KV in 30 layers, and what a 256-token step adds over it with flash attention, which `auto`
    # turns on for a device that cannot hold the model's window without it: the f16 mask's column
    per_cell = 30 * 3 * 128 * 2 + 256 * 2
    free = 512 * 2**20 + facts.file_bytes + logit_rows_held(256) * facts.n_vocab * 4 + 256 * (4 * 576 + 2 * 1536) * 4 + 1200 * per_cell
    # (under 2 GiB free the margin is its 512 MiB floor)
    monkeypatch.setenv(MEMORY_ENV, str(free))
    settings = RunSettings(chunk=256, max_tokens=10)
    plan = plan_cells(facts, DeviceMemory(free, MEMORY_ENV), 256, logit_rows=256, flash_attn=True)
    want = pot_cells(plan.cells, facts.n_ctx_train, answer_reserve(settings), 256)
    path, _, question = small_doc
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, "-v"])  # -v: the plan's reasons
    assert res.exit_code == 0, res.output
    assert f"the pot takes {want:,} cells" in res.stderr
    assert f"with infinipot, budget {want:,} cells" in res.stderr  # InfiniPot's |M| (Policy.fit)
    without = plan_cells(facts, DeviceMemory(free, MEMORY_ENV), 256, logit_rows=256).cells
    # weighed against the pot's own context (the one the session then allocates), not the model's window
    context = re.search(r"\(context ([\d,]+)\)", res.stderr).group(1)
    assert f"flash attention on (auto: without it this device holds {without:,} cells, under the {context} this " \
           "reading needs" in res.stderr


def test_policy_full_refuses_before_reading_with_the_numbers(tmp_path, smollm2_path):
    text, question, _ = logbook(n_entries=260)  # about 11K tokens: past SmolLM2's 8K context
    path = tmp_path / "long.txt"
    path.write_text(text)
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, "--policy", "full"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "full attention keeps every token: the input is more than")
    assert "trained context 8,192 cells" in res.stderr
    assert "reading" not in res.stderr.split("error:")[0]  # refused before anything was read


def test_a_bad_budget_is_one_line(small_doc):
    path, _, question = small_doc
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, "--budget", "lots"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--budget must be a number of cells or auto")


def test_past_the_window_the_default_path_takes_the_pot_measured_best(tmp_path, smollm2_path, monkeypatch):
    """A model measured past the window (KnownModel.beyond_window_pot) is read there, on the default path,
    with the pot that answered best, not the largest the device holds; a policy the user names, a device that
    holds less, and a model not measured keep the largest pot that fits."""
    from dataclasses import replace

    from kvpot.ingest import collect_sources
    from kvpot.models.registry import KNOWN
    from kvpot.session.reading_plan import plan_reading

    text, _, _ = logbook(n_entries=260)  # about 11K tokens: past SmolLM2's 8K context
    path = tmp_path / "long.txt"
    path.write_text(text)
    facts = read_model_facts(smollm2_path)
    settings = RunSettings(chunk=256, max_tokens=10)
    reserve = answer_reserve(settings)
    roomy = DeviceMemory(24 << 30, "RAM")
    largest = pot_cells(plan_cells(facts, roomy, 256, logit_rows=256).cells, facts.n_ctx_train, reserve, 256)

    def plan(chosen: bool, memory: DeviceMemory = roomy, spec: str = settings.policy, asking: Asking = Asking.LATER):
        return plan_reading(replace(settings, policy=spec), facts, collect_sources([str(path)]), policy_chosen=chosen,
                            reserve=reserve, memory=memory, asking=asking)

    unmeasured = plan(False)
    assert unmeasured.settings.budget == largest and f"the pot takes {largest:,} cells" in unmeasured.note
    assert plan(False, asking=Asking.FIRST).settings.budget == largest
    monkeypatch.setitem(KNOWN, "smollm2-135m", replace(KNOWN["smollm2-135m"], beyond_window_pot=1024,
                                                       beyond_window_pot_asked=1536))
    measured = plan(False)
    assert measured.settings.budget == 1024 < largest
    assert "1,024 cells, the size that answered best past the window" in measured.note
    assert "when the question is not known while reading" in measured.note
    asked = plan(False, asking=Asking.FIRST)  # as `kvpot ask` reads: the pot measured best that way
    assert asked.settings.budget == 1536 and "when the question is known before reading" in asked.note
    assert f"the device holds up to {largest:,}" in measured.note
    assert plan(True).settings.budget == largest  # --policy infinipot named: the largest pot
    assert plan(False, spec="infinipot:nuc_ratio=0").settings.budget == largest  # another spec from a config
    # a device that holds less than the measured pot: all it holds
    # (~18 MiB of step buffers, then ~1,000 cells at 23 KiB: flash attention, as `auto` turns it on here)
    free = 512 * 2**20 + facts.file_bytes + (1 << 20) * 42
    small = plan(False, DeviceMemory(free, "RAM"))
    assert 256 <= small.settings.budget < 1024 and "all the device holds" in small.note
    # measured only as `kvpot ask` reads (the 0.5B Qwen model): chat keeps the largest pot
    monkeypatch.setitem(KNOWN, "smollm2-135m", replace(KNOWN["smollm2-135m"], beyond_window_pot=None,
                                                       beyond_window_pot_asked=1536))
    assert plan(False).settings.budget == largest
    assert plan(False, asking=Asking.FIRST).settings.budget == 1536
    # not measured with the focused read answering: a focused ask takes the pot measured question first, and
    # says so without claiming the focused measurement
    not_focused = plan(False, asking=Asking.FOCUSED)
    assert not_focused.settings.budget == 1536 and "(--focus)" not in not_focused.note
    # measured with it (the 1.5B Qwen model): ask on files takes that pot, a pipe or --no-focus the asked one
    monkeypatch.setitem(KNOWN, "smollm2-135m", replace(KNOWN["smollm2-135m"], beyond_window_pot=1024,
                                                       beyond_window_pot_asked=1536, beyond_window_pot_focused=512))
    focused = plan(False, asking=Asking.FOCUSED)
    assert focused.settings.budget == 512
    assert "the passages it finds are read again (--focus)" in focused.note
    assert plan(False, asking=Asking.FIRST).settings.budget == 1536
    # chat never focuses: its question comes after reading, whatever --focus says
    assert Asking.of(False, focused=True) is Asking.LATER
    assert plan(False, asking=Asking.of(False, focused=True)).settings.budget == 1024
    assert Asking.of(True, focused=True) is Asking.FOCUSED and Asking.of(True) is Asking.FIRST
    assert plan(True, asking=Asking.FOCUSED).settings.budget == largest  # a policy named


def test_help_names_the_measured_pots_the_registry_holds(monkeypatch):
    """`kvpot ask --help` names each measured model's pots as the registry has them, so a size changed there
    is said in the help too; a model with none is not named."""
    from dataclasses import replace

    from kvpot.models.registry import KNOWN
    from kvpot.session.beyond_window import measured_sizes

    monkeypatch.setitem(KNOWN, "smollm2-135m", replace(KNOWN["smollm2-135m"], beyond_window_pot=1024,
                                                       beyond_window_pot_asked=1536))
    monkeypatch.setitem(KNOWN, "gemma3-270m", replace(KNOWN["gemma3-270m"], beyond_window_pot=None,
                                                      beyond_window_pot_asked=3072, beyond_window_pot_focused=512))
    said = measured_sizes().split("; ")
    assert "smollm2-135m 1,536 cells for ask and 1,024 cells for chat" in said
    assert "gemma3-270m 512 cells for ask on files and 3,072 cells for ask on a pipe" in said
    measured = [k for k in KNOWN.values() if k.beyond_window_pot or k.beyond_window_pot_asked]
    assert len(said) == len(measured)
