"""The `make bench-*` recipes of docs/benchmarks.md: every target's commands parse against today's CLI and
policies, and one command of each `kvpot bench` kind runs on a tiny input.

Each target runs with kvpot and Python replaced by a recorder (so shell loops expand as they would, and nothing
is measured), after `make -n` has printed it; the recorded `kvpot bench` lines are parsed by the Typer app
itself, so a renamed option, policy parameter or model fails here."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from kvpot.bench import infllm_cache, memory_limit, texts
from kvpot.bench.qa import CLOSED as QA_CLOSED
from kvpot.bench.qa import DEFAULT as QA_DEFAULT
from kvpot.cli.main import app
from kvpot.models.registry import KNOWN
from kvpot.policies import make_policy
from studies import (
    answer_taps_speed,
    attn_speed,
    curve,
    first_chat,
    locret_hidden,
    locret_trace,
    needle_trace,
    nuc_head,
    nuc_shortlist,
    qa_budget,
    qa_source_at1,
    serve_clients,
    store_cost,
)

REPO = Path(__file__).resolve().parent.parent
TARGETS = sorted(set(re.findall(r"^(bench-[\w-]+):", (REPO / "Makefile").read_text(), re.M)))
PY_RECIPES = {"studies.curve": curve, "studies.needle_trace": needle_trace,
              "studies.locret_hidden": locret_hidden, "studies.store_cost": store_cost,
              "studies.nuc_head": nuc_head, "studies.locret_trace": locret_trace,
              "studies.qa_budget": qa_budget,
              "kvpot.bench.memory_limit": memory_limit, "studies.qa_source_at1": qa_source_at1,
              "studies.answer_taps_speed": answer_taps_speed, "kvpot.bench.infllm_cache": infllm_cache,
              "studies.nuc_shortlist": nuc_shortlist, "studies.attn_speed": attn_speed,
              "studies.serve_clients": serve_clients, "studies.first_chat": first_chat}
# prerequisites that build, install or download: taken as done, so only the target's own commands run
DONE = ("install", "pull-test-models", "train-deps", "runtime", "venv")
runner = CliRunner()


def record(target: str, tmp: Path, *settings: str) -> list[list[str]]:
    """The target's commands as run, kvpot and Python replaced by a recorder: [["kvpot"|"python", args...]]."""
    log = tmp / "argv.jsonl"
    rec = tmp / "rec"
    rec.write_text(f"#!{sys.executable}\nimport json, sys\n"
                   f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    rec.chmod(rec.stat().st_mode | stat.S_IXUSR)
    args = ["make", "-s", "-C", str(REPO), *(f"-o{d}" for d in DONE), target, f"KVPOT={rec} kvpot",
            f"BENCH_PY={rec} python", f"BENCH_DIR={tmp / 'out'}", f"BENCH_TEXTS={tmp / 'texts'}", "AB_ROUNDS=1",
            f"QA_JSON={tmp / 'qa.json'}", f"PHONE_1M_DIR={tmp / 'phone-1m'}", f"BIN={tmp / 'no-venv'}", *settings]  # a command past the recorder fails
    env = {**os.environ, "MAKEFLAGS": ""}
    dry = subprocess.run([*args[:1], "-n", *args[1:]], capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def parse_command(args: list[str]) -> dict:
    """Parse one `kvpot COMMAND ARGS` line (not a bench) as the CLI would, without running it: its parameters."""
    top = typer.main.get_command(app)
    cmd = top.get_command(click.Context(top), args[0])
    assert cmd is not None, f"no `kvpot {args[0]}`"
    return cmd.make_context(args[0], list(args[1:]), parent=click.Context(top)).params


def parse_bench(args: list[str]) -> tuple[str, dict]:
    """Parse one `kvpot ARGS` line as the CLI would, without running it: (subcommand, its parameters)."""
    top = typer.main.get_command(app)
    assert args[0] == "bench", args
    group = top.get_command(click.Context(top), "bench")
    sub = group.get_command(click.Context(group), args[1])
    assert sub is not None, f"no `kvpot bench {args[1]}`"
    ctx = sub.make_context(f"bench {args[1]}", list(args[2:]), parent=click.Context(group))
    return args[1], ctx.params


def check_params(name: str, params: dict) -> None:
    """The values an option parser cannot judge: policy specs, known models, adapters that exist."""
    given = params.get("policy")  # bench route reads no document: it has no policy
    specs = [] if given is None else given if isinstance(given, list) else [given]
    for spec in specs:
        if spec not in (QA_DEFAULT, QA_CLOSED):  # bench qa's "what `kvpot ask` chooses", and closed book
            make_policy(spec)
        gate = re.search(r"gate=([^,]+\.gguf)", spec)
        assert gate is None or (REPO / gate[1]).is_file(), spec
    models = params.get("model") or params.get("models")
    for m in models if isinstance(models, list) else [models]:
        assert m in KNOWN, m


@pytest.mark.parametrize("target", TARGETS)
def test_every_bench_target_parses(target, tmp_path):
    lines = record(target, tmp_path)
    assert lines, f"{target} runs no command"
    for who, *args in lines:
        outs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--json"]
        assert all(Path(o).is_relative_to(tmp_path) for o in outs), outs  # BENCH_DIR (or QA_JSON) decides
        if who == "kvpot":
            if args[0] == "pull":
                assert args[1] in KNOWN
                continue
            if args[0] == "ask":  # a read as users run it (bench-phone-1m)
                parse_command(args)
                continue
            name, params = parse_bench(args)
            check_params(name, params)
            if name == "ppl":  # reads a text bench-texts writes
                kind = params["file"].stem
                assert params["file"].parent == tmp_path / "texts" and kind in texts.KINDS, params["file"]
        else:
            assert who == "python" and args[0] == "-m", args
            if args[1] == "kvpot.bench.texts":
                assert args[2] in texts.KINDS and len(args) == 4, args
            else:
                a = PY_RECIPES[args[1]].parser().parse_args(args[2:])
                if hasattr(a, "policy"):
                    make_policy(a.policy)


def test_the_docs_name_every_target():
    docs = "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    for t in TARGETS:
        assert f"make {t}" in docs, t


def tiny(args: list[str], swap: dict[str, str], drop_repeats: tuple[str, ...]) -> list[str]:
    """The same command line with the values in `swap` replaced and repeated options cut to their first."""
    out, seen, i = [], set(), 0
    while i < len(args):
        opt = args[i]
        if opt.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):  # option and value
            val = args[i + 1]
            if opt in drop_repeats and opt in seen:
                i += 2
                continue
            seen.add(opt)
            out += [opt, swap.get(opt, val)]
            i += 2
        else:
            out.append(opt)
            i += 1
    return out


def first(target: str, sub: str, tmp: Path) -> list[str]:
    return next(args for who, *args in record(target, tmp) if who == "kvpot" and args[:2] == ["bench", sub])


def test_a_niah_recipe_runs_on_a_tiny_haystack(tmp_path, gemma_path):
    args = first("bench-infllm", "niah", tmp_path)
    out = tmp_path / "niah.json"
    line = tiny(args, {"--length": "1024", "--json": str(out), "-t": "2"}, ("-d", "--seed", "--length"))
    r = runner.invoke(app, line)
    assert r.exit_code == 0, r.output
    cases = json.loads(out.read_text())
    assert len(cases) == 1 and cases[0]["length"] == 1024 and cases[0]["policy"] == line[line.index("-P") + 1]


def test_a_ppl_recipe_runs_on_a_tiny_text(tmp_path, gemma_path):
    recorded = record("bench-edgeinfinite-ppl", tmp_path, "EI_MODELS=gemma3-270m", "EI_TEXTS=code-8k")
    args = next(r[1:] for r in recorded if r[:3] == ["kvpot", "bench", "ppl"])
    text = tmp_path / "texts" / "code-8k.txt"
    text.parent.mkdir(exist_ok=True)
    text.write_text(texts.logbook_text()[:4000])
    out = tmp_path / "ppl.json"
    line = tiny(args, {"--tokens": "128", "--json": str(out)}, ())
    r = runner.invoke(app, line)
    assert r.exit_code == 0, r.output
    assert [x["policy"] for x in json.loads(out.read_text())] == [a for i, a in enumerate(line) if line[i - 1] == "-P"]


def test_a_throughput_recipe_runs_on_a_tiny_input(tmp_path, gemma_path):
    args = first("bench-speed-ab-exc", "throughput", tmp_path)
    out = tmp_path / "t.json"
    r = runner.invoke(app, tiny(args, {"--tokens": "128", "--stock-tokens": "64", "--json": str(out)}, ()))
    assert r.exit_code == 0, r.output
    assert out.exists()


def test_texts_are_the_files_they_name(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "b.py").write_text("x = 1\n")
    (lib / "a.py").write_text("y = 2\n" * 10)
    (lib / "c.txt").write_text("not python\n")
    assert texts.stdlib_code(5, folder=lib) == "# file: a.py\n" + "y = 2\n" * 10 + "\n# file: b.py\nx = 1\n\n"
    assert texts.stdlib_code(5, max_bytes=20, folder=lib) == "# file: b.py\nx = 1\n\n"
    assert texts.stdlib_code(1, folder=lib).count("# file:") == 1
    (tmp_path / "m.info.gz").write_bytes(gzip.compress(b"node\x1f one\n\x1fnode two\n"))
    assert texts.manual_text(tmp_path / "m.info.gz") == "node one\nnode two\n"
    out = tmp_path / "log.txt"
    assert texts.main(["logbook", str(out)]) == 0 and out.read_text() == texts.logbook_text()
    assert texts.main(["poetry", str(out)]) == 2


def test_the_library_text_is_the_shell_lines_bytes_with_its_line_inserted(tmp_path):
    """library-1m: the .py files outside test folders in byte order of their paths, cut at n bytes (a cut
    character replaced), the line to find after the line that holds 47 % of the text."""
    lib = tmp_path / "lib"
    for rel, text in {"b.py": "b\n" * 50, "a/z.py": "z\n" * 50, "B.py": "B\n" * 50, "test/t.py": "t\n",
                      "a/tests/u.py": "u\n", "unittest/ok.py": "é\n" * 50, "c.txt": "not python\n"}.items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_text(text)
    raw = ("B\n" * 50 + "z\n" * 50 + "b\n" * 50 + "é\n" * 50).encode()  # ./B.py < ./a/z.py < ./b.py < ./unittest
    n = len(raw) - 2  # cuts the last "é" in two
    joined = raw[:n].decode("utf-8", "replace")
    assert joined.endswith("\n\ufffd")
    got = texts.library_text(lib, n_bytes=n)
    at = joined.index("\n", len(joined) * 47 // 100) + 1
    assert got == joined[:at] + texts.STRONGBOX + joined[at:]


def test_niah_defaults_run(tmp_path, gemma_path):
    """`kvpot bench niah` with no -P, --budget or --chunk: the default policy fits the default budget."""
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "niah.json"
    res = CliRunner().invoke(app, ["bench", "niah", "-m", str(gemma_path), "--length", "256", "-d", "0.5",
                                   "--task", "passkey", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())[0]["policy"].startswith("infinipot")
