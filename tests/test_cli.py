"""The CLI: help texts, doctor, run against llama_cpp.Llama, and bad inputs as one clear line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli
from typer.testing import CliRunner

import kvpot
from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.session.prompting import Segment, choose_format

runner = CliRunner()

COMMANDS = ["ask", "chat", "doctor", "pull", "models", "run", "demo", "build", "rpc-server"]


def test_top_level_help_lists_commands():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in COMMANDS:
        assert cmd in res.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_has_help(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0
    assert "Usage:" in res.stdout
    # the first docstring line is the help text
    doc = app.registered_commands[COMMANDS.index(cmd)].callback.__doc__.strip().splitlines()[0]
    assert " ".join(doc.split()[:4]) in " ".join(res.stdout.split())


def test_doctor_reports_the_runtime():
    res = run_cli("doctor", env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    for needle in ("llama.cpp commit", "0c1e57098", "kvpot ABI", f"library {kvpot.ABI_VERSION}, python {kvpot.ABI_VERSION}", "backends", "CPU", "kvpot home",
                   "devices", "layers and pot on", "block stores"):
        assert needle in res.stdout, needle  # the report is what was asked for: stdout


def test_doctor_counts_the_block_stores(tmp_path):
    from kvpot.cli.doctor import block_stores

    assert block_stores(tmp_path / "absent") == f"none in {tmp_path / 'absent'}"
    (tmp_path / "a.kvblk").write_bytes(b"\0" * 3 * 2**20)
    (tmp_path / "b.kvblk").write_bytes(b"\0" * 2**19)
    (tmp_path / "notes.txt").write_text("not a store")
    assert block_stores(tmp_path).startswith(f"2 in {tmp_path}, 3.5 MiB")


def test_models_lists_every_known_name_whole_on_a_narrow_terminal(smollm2_path, gemma_path):
    """The name is what -m takes: on an 80-column terminal (and a 60-column one) each is printed whole on
    one line, the prose columns wrapping instead."""
    from kvpot.models.registry import KNOWN

    for columns in ("80", "60"):
        res = run_cli("models", env={"COLUMNS": columns})
        assert res.returncode == 0, res.stderr
        for name in KNOWN:
            assert name in res.stdout, (columns, name, res.stdout)


@pytest.fixture(scope="module")
def short_doc(tmp_path_factory):
    document, question, _ = logbook(n_entries=12, seed=3)
    path = tmp_path_factory.mktemp("docs") / "log.txt"
    path.write_text(document)
    return path, document, question


def test_run_matches_llama_cpp(smollm2_path, short_doc):
    """`kvpot run` (full attention, the default) answers as stock llama_cpp.Llama does, greedy, on the
    tokens the session reads: the prompt format's opening, the document, the question."""
    from llama_cpp import Llama

    from kvpot.runtime.llama import LlamaModel

    path, document, question = short_doc
    res = run_cli("run", "--model", str(smollm2_path), "--file", str(path), "--prompt", question,
                  "--threads", "2", "--n-predict", "24")
    assert res.returncode == 0, res.stderr
    assert "fits the 8K window: reading it whole" in res.stderr  # the line before reading, in a user's words
    vocab = LlamaModel(str(smollm2_path), vocab_only=True)
    try:
        fmt = choose_format(vocab, "auto")
        segments = [*fmt.document_open(), Segment(document, special=False), *fmt.first_question(question)]
        tokens = vocab.bos() + [t for seg in segments for t in vocab.tokenize(seg.text, special=seg.special)]
    finally:
        vocab.close()
    llm = Llama(model_path=str(smollm2_path), n_ctx=2048, n_batch=512, n_threads=2, n_threads_batch=2,
                seed=0, verbose=False)
    ref = llm.create_completion(tokens, max_tokens=24, temperature=0.0, stop=list(fmt.stop) or None,
                                seed=0)["choices"][0]["text"]
    assert ref.strip(), "the reference produced no text; the comparison would be empty"
    assert res.stdout == ref + "\n"


def test_run_and_ask_word_the_question_the_same(smollm2_path, short_doc, tmp_path):
    """One answering path: `run -P infinipot` and `ask` read the same tokens and give the same answer."""
    path, _, question = short_doc
    args = ("--model", str(smollm2_path), "--threads", "2", "--n-predict", "16")
    (tmp_path / "run").mkdir()
    (tmp_path / "ask").mkdir()
    ran = run_cli("run", "--file", str(path), "--prompt", question, "--policy", "infinipot", "--budget", "256", *args,
                  env={"KVPOT_SAVE_LOGITS": str(tmp_path / "run")})
    asked = run_cli("ask", str(path), question, "--policy", "infinipot", "--budget", "256", "--no-focus", *args,
                    env={"KVPOT_SAVE_LOGITS": str(tmp_path / "ask")})
    assert ran.returncode == 0 and asked.returncode == 0, ran.stderr + asked.stderr
    assert ran.stdout == asked.stdout and ran.stdout.strip()
    assert np.array_equal(np.load(tmp_path / "run" / "turn-1.npy"), np.load(tmp_path / "ask" / "turn-1.npy"))


def test_run_refuses_a_document_past_the_context(smollm2_path, short_doc):
    path, _, question = short_doc
    res = run_cli("run", "--model", str(smollm2_path), "--file", str(path), "--prompt", question, "--ctx-size", "128")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "more than the context size asked for, 128 cells")
    assert "full attention keeps every token: the input is" in res.stderr


def _bad_run(tmp_path, smollm2_path, *, model=None, file=None):
    return runner.invoke(app, ["run", "--model", str(model or smollm2_path), "--file", str(file), "--prompt", "q"])


@pytest.mark.parametrize("case,needle", [
    ("missing_file", "does not exist"),
    ("directory", "is a directory"),
    ("empty", "is empty"),
    ("binary", "looks binary"),
    ("model_not_gguf", "is not a GGUF file"),
    ("model_missing", "does not exist"),
    ("model_directory", "is a directory"),
])
def test_bad_inputs_give_one_clear_line(case, needle, tmp_path, smollm2_path):
    text = tmp_path / "doc.txt"
    text.write_text("some text\n")
    model, file = smollm2_path, text
    if case == "missing_file":
        file = tmp_path / "nope.txt"
    elif case == "directory":
        file = tmp_path
    elif case == "empty":
        file = tmp_path / "empty.txt"
        file.write_bytes(b"")
    elif case == "binary":
        file = tmp_path / "blob.bin"
        file.write_bytes(bytes(range(256)) * 40)
    elif case == "model_not_gguf":
        model = tmp_path / "fake.gguf"
        model.write_text("this is text, not a model\n")
    elif case == "model_missing":
        model = tmp_path / "gone.gguf"
    elif case == "model_directory":
        model = tmp_path
    res = _bad_run(tmp_path, smollm2_path, model=model, file=file)
    assert res.exit_code != 0
    assert_one_line_error(res.stderr, needle)


def test_bench_is_listed_and_has_help():
    res = runner.invoke(app, ["bench", "throughput", "--help"])
    assert res.exit_code == 0
    assert "stock" in res.stdout


def test_run_with_a_pot_policy_reads_past_the_context(smollm2_cut_path, tmp_path):
    document, question, _ = logbook(n_entries=40, seed=4)
    path = tmp_path / "long.txt"
    path.write_text(document)
    # full attention refuses this context size ...
    full = run_cli("run", "-m", str(smollm2_cut_path), "-f", str(path), "-p", question, "--ctx-size", "512", "-n", "8")
    assert full.returncode != 0 and "more than the context size asked for, 512 cells" in full.stderr
    # ... a pot policy reads it all with 256 cells
    res = run_cli("run", "-m", str(smollm2_cut_path), "-f", str(path), "-p", question, "--policy", "snapkv",
                  "--budget", "256", "--chunk", "128", "-n", "8")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()


def test_bad_policy_spec_is_one_line(smollm2_cut_path, tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("hello\n")
    res = runner.invoke(app, ["run", "-m", str(smollm2_cut_path), "-f", str(path), "-p", "q", "--policy", "snapkv:windw=3"])
    assert res.exit_code != 0
    assert_one_line_error(res.stderr, "windw")


def test_bench_throughput_reports_ratio_to_stock(smollm2_cut_path, tmp_path):
    out = tmp_path / "tp.json"
    res = run_cli("bench", "throughput", "-m", str(smollm2_cut_path), "--tokens", "512", "--stock-tokens", "256",
                  "--budget", "128", "--chunk", "64", "--decode", "0", "--json", str(out), env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    import json

    data = json.loads(out.read_text())
    stock, pot = data["stock"], data["pot"][0]
    # --decode 0: no answer tokens, no decode figure anywhere
    assert data["plan"]["decode"] == 0
    assert not [k for r in (stock, pot) for k in r if k.startswith("decode")]
    assert "decode" not in res.stderr
    assert stock["mode"] == "stock" and stock["tokens"] == 256
    assert pot["tokens"] == 512 and pot["compactions"] > 0
    assert pot["ratio_vs_stock"] == pytest.approx(pot["tok_s"] / stock["tok_s"])
    assert 0 < pot["kv_bytes"] <= pot["kv_bytes_allocated"]
    # /proc's RSS now and ru_maxrss count pages a little differently: compare loosely
    assert 0 < pot["rss_start_mb"] <= 1.05 * pot["peak_rss_mb"] and 0.5 * pot["peak_rss_mb"] < pot["rss_end_mb"] <= 1.05 * pot["peak_rss_mb"]
    assert "stock llama.cpp" in res.stderr


def test_bench_throughput_times_answer_tokens_after_each_read(smollm2_cut_path, tmp_path):
    """--decode N: after each read (and after stock's prefill) a question and N greedy answer tokens
    through the engine's answer path; tokens/s per length and the ratio to the shortest length's."""
    import json

    out = tmp_path / "tp.json"
    res = run_cli("bench", "throughput", "-m", str(smollm2_cut_path), "--tokens", "256", "--tokens", "512",
                  "--stock-tokens", "256", "--budget", "128", "--chunk", "64", "--decode", "4", "--json", str(out),
                  env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    stock, pots = data["stock"], data["pot"]
    assert data["plan"]["decode"] == 4 and [p["tokens"] for p in pots] == [256, 512]
    for r in (stock, *pots):
        assert r["decode_tokens_asked"] == 4 and r["decode_question_tokens"] > 0
        # N tokens each time: where the greedy choice would have ended the answer, the JSON says so
        assert r["decode_tokens"] == 4 and r["decode_stop"] == "the 4-token limit"
        assert r["decode_eog"] == (r["decode_eog_masked"] > 0) == (r["decode_eog_first"] is not None)
        assert r["decode_tok_s"] == pytest.approx(r["decode_tokens"] / r["decode_seconds"])
    for p in pots:
        assert p["decode_shortest_tokens"] == 256
        assert p["decode_ratio_vs_shortest"] == pytest.approx(p["decode_tok_s"] / pots[0]["decode_tok_s"])
        assert p["decode_ratio_vs_stock"] == pytest.approx(p["decode_tok_s"] / stock["decode_tok_s"])
    assert pots[0]["decode_ratio_vs_shortest"] == pytest.approx(1.0)
    # the read's figures are still there, under the same keys
    assert pots[1]["compactions"] > 0 and pots[1]["ratio_vs_stock"] == pytest.approx(pots[1]["tok_s"] / stock["tok_s"])
    assert "decode tok/s" in res.stderr and "decode vs 256" in res.stderr and "then 4" in res.stderr


def test_bench_niah_reports_every_case_and_resumes(smollm2_cut_path, tmp_path):
    """Two policies over one passkey haystack: each case's verdict is the key's presence in its answer,
    the table is printed, and --resume runs nothing already in the JSON file."""
    import json

    out = tmp_path / "niah.json"
    args = ["bench", "niah", "-m", str(smollm2_cut_path), "--task", "passkey", "--length", "600", "-d", "0.5",
            "-P", "streaming", "-P", "full", "--budget", "256", "--chunk", "64", "--json", str(out)]
    res = run_cli(*args, env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    cases = json.loads(out.read_text())
    assert [c["policy"] for c in cases] == ["streaming", "full"]
    for c in cases:
        assert c["correct"] == (c["key"] in c["answer"]) and 550 < c["tokens"] < 700
    assert cases[0]["compactions"] > 0 and cases[1]["compactions"] == 0
    assert "needle retrieval (passkey)" in res.stderr
    # stderr is a pipe here: a line as each case starts and as it ends, so a log shows where a long grid is
    lines = res.stderr.splitlines()
    started = [lines.index("case 1/2: streaming 600 @ 0.5, seed 0"), lines.index("case 2/2: full 600 @ 0.5, seed 0")]
    assert started[0] < next(i for i, line in enumerate(lines) if line.startswith("1/2 cases; last: streaming")) < started[1]
    again = run_cli(*args, "--resume", env={"COLUMNS": "200"})
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text()) == cases
    # another grid into the same file: counted as its own cases, the file's others kept
    other = [a if a != "0.5" else "0.9" for a in args[:args.index("-P")]] + ["-P", "streaming", *args[args.index("--budget"):]]
    more = run_cli(*other, "--resume", env={"COLUMNS": "200"})
    assert more.returncode == 0, more.stderr
    assert "case 1/1: streaming 600 @ 0.9, seed 0" in more.stderr.splitlines(), more.stderr
    assert json.loads(out.read_text())[:2] == cases and len(json.loads(out.read_text())) == 3
    out.write_text("[1, 2]")  # JSON, but not cases: one line, not a traceback
    res = run_cli(*args, "--resume")
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "is not a niah results file")


BENCH_WRITERS = {  # each bench command that writes results, with what it needs to start reading
    "throughput": ["--tokens", "512", "--stock-tokens", "256", "--decode", "0"],
    "niah": ["--task", "passkey", "--length", "600", "-P", "full"],
    "qa": ["-P", "full", "--length", "8192", "--limit", "1"],
    "ppl": ["-f", "{text}"],
    "context": ["--tokens", "512"],
}


@pytest.mark.parametrize("cmd", BENCH_WRITERS)
def test_bench_refuses_an_output_it_cannot_or_must_not_write_before_reading(cmd, smollm2_cut_path, tmp_path):
    """--json naming the model (or ppl's input), a directory, or a file in a missing folder gets one line and
    exit 1 before any model is loaded, and the model and the input keep every byte."""
    import hashlib
    import shutil

    model = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_cut_path, model)
    text = tmp_path / "doc.txt"
    text.write_text("The storeroom's code is 4417.\n" * 40)
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (model, text)}
    args = [a.replace("{text}", str(text)) for a in BENCH_WRITERS[cmd]]
    outputs = {model: "it is the model", tmp_path: "it is a directory", tmp_path / "none" / "r.json": "does not exist"}
    if cmd == "ppl":
        outputs[text] = "it is the input"
    if Path("/proc/version").is_file():  # a regular file in a folder that takes no new file (Linux, Android)
        outputs[Path("/proc/version")] = "cannot save the results to /proc/version"
    for out, said in outputs.items():
        res = run_cli("bench", cmd, "-m", str(model), *args, "--json", str(out), env={"COLUMNS": "200"})
        assert res.returncode == 1, res.stderr
        assert_one_line_error(res.stderr, said)
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (model, text)} == digest


def test_bench_throughput_refuses_a_schedule_its_longest_read_cannot_keep_before_any_part(smollm2_cut_path):
    """IMDC's first step keeps m_0 cells whatever the length, and an m_0 of 8 leaves SnapKV less than its
    window once the input is long: said before stock's part or the first read runs."""
    res = run_cli("bench", "throughput", "-m", str(smollm2_cut_path), "-P", "imdc:pruner=snapkv,m_0=8",
                  "--budget", "1024", "--chunk", "512", "--tokens", "2048", "--tokens", "65536", "--decode", "0",
                  env={"COLUMNS": "200"})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "keeps as few as 8 cells, too few for its pruner snapkv")
    assert "stock llama.cpp prefill" not in res.stderr


def test_bench_ppl_equals_across_policies_that_evict_nothing(smollm2_cut_path, tmp_path):
    """With a budget above the text's length neither StreamingLLM nor full attention evicts a cell, so
    both score every token given the same past: the same perplexity."""
    import json

    text = tmp_path / "log.txt"
    text.write_text(logbook(n_entries=40, seed=3)[0])
    out = tmp_path / "ppl.json"
    res = run_cli("bench", "ppl", "-f", str(text), "-m", str(smollm2_cut_path), "-P", "streaming", "-P", "full",
                  "--budget", "1024", "--chunk", "64", "--tokens", "700", "--json", str(out),
                  env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    stream, full = json.loads(out.read_text())
    assert stream["compactions"] == full["compactions"] == 0
    assert stream["scored_tokens"] == full["scored_tokens"] == stream["tokens"] - 1
    assert stream["nll"] == pytest.approx(full["nll"], abs=1e-4)
    assert "perplexity" in res.stderr


def test_bench_context_reopens_with_the_same_answer(smollm2_cut_path, tmp_path):
    """kvpot reads, answers, saves and reopens; stock llama.cpp does the same with its own state file."""
    out = tmp_path / "ctx.json"
    res = run_cli("bench", "context", "-m", str(smollm2_cut_path), "--tokens", "600", "-P", "infinipot:pot=256,keep=128",
                  "--keep-files", str(tmp_path / "files"), "--json", str(out), env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    import json

    kv, stock = json.loads(out.read_text())
    assert kv["mode"] == "kvpot" and stock["mode"] == "stock"
    assert kv["compactions"] > 0 and kv["pot_cells"] <= 256 + 512  # the pot plus the answer reserve
    assert kv["same_answer_after_reopen"], (kv["answer"], kv["answer_after_reopen"])
    assert stock["same_first_token_after_reopen"]
    assert kv["context_bytes"] == (tmp_path / "files" / "logbook-600.kvpotctx").stat().st_size
    assert 500 < kv["tokens"] < 700 and 500 < stock["tokens"] < 700  # the same generated logbook
    assert kv["reopen_speedup"] == pytest.approx(kv["reread_seconds"] / kv["reopen_seconds"])
    assert "stock llama.cpp" in res.stderr


def test_bench_throughput_reports_the_store_on_disk_and_leaves_none(smollm2_cut_path, tmp_path):
    """InfLLM keeps evicted blocks on disk: the bench reports the store's size and deletes it after."""
    import json

    out = tmp_path / "tp.json"
    res = run_cli("bench", "throughput", "-m", str(smollm2_cut_path), "--no-upstream", "-P", "infllm", "--tokens", "2048",
                  "--stock-tokens", "256", "--budget", "512", "--chunk", "128", "--json", str(out),
                  env={"COLUMNS": "200", "KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    pot = json.loads(out.read_text())["pot"][0]
    # every token past the initial ones and the local window went to the store, K and V of each pot layer
    assert pot["disk_bytes"] > (2048 - 512 - 128) * 2 * 2 * 64  # > F16 K+V of one KV head of 64 per token
    assert "on disk" in res.stderr
    assert list((tmp_path / "blocks").glob("*.kvblk")) == []
