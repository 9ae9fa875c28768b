"""The enforced-memory runner (kvpot.bench.memory_limit, `make bench-memory-limit`) on the smallest model:
a limit far below what loading it takes must be exceeded (the kernel kills the read, the runner says so in
one line and records it), and a generous one must hold (the read answers, its peak charge stays under the
limit). Skipped, with the reason, only where the machine offers no memory cgroup to make a child in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvpot.bench.memory_limit import KILLED, find_home

HOME = find_home()
pytestmark = pytest.mark.skipif(isinstance(HOME, str), reason=f"no enforceable memory limit here: {HOME}")

MiB = 1 << 20
FAST = ["--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1"]
TEXT = "The strongbox code is 4417. The lighthouse keeper wrote it down on a Tuesday.\n" * 20


def limited(limit: str, tmp_path, smollm2_path, device: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """`device`: the memory kvpot is told it has (KVPOT_DEVICE_MEMORY), else what it reads (the cgroup's room)."""
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    out = tmp_path / "limit.json"
    kvpot = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
    env = {k: v for k, v in os.environ.items() if k != "KVPOT_DEVICE_MEMORY"} | (
        {"KVPOT_DEVICE_MEMORY": device} if device else {})
    res = subprocess.run([sys.executable, "-m", "kvpot.bench.memory_limit", "--limit", limit, "--json", str(out), "--",
                          *kvpot, "ask", str(doc), "Again: the strongbox code is", "-m", str(smollm2_path), *FAST,
                          "--json"], capture_output=True, text=True, timeout=600, env=env)
    return res, json.loads(out.read_text())


def runner_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "within the memory limit" in ln or "by the memory limit" in ln]


def test_a_limit_below_the_model_is_exceeded_and_said_in_one_line(tmp_path, smollm2_path):
    # 48 MiB: the interpreter and kvpot's imports fit, the model's weights (~100 MiB, copied out of the
    # mapping for this CPU) cannot. kvpot is told it has 2 GiB, so it plans past the limit and the kernel kills it
    res, rec = limited("48MiB", tmp_path, smollm2_path, device="2GiB")
    assert res.returncode == KILLED, res.stderr
    lines = runner_lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("killed by the memory limit of 48 MiB"), res.stderr
    assert res.stderr.rstrip().splitlines()[-1] == lines[0]
    assert rec["killed"] and rec["oom_kills"] >= 1 and rec["returncode"] == -9
    assert rec["limit_bytes"] == 48 * MiB and rec["result"] is None
    assert rec["peak_charged_bytes"] is None or rec["peak_charged_bytes"] <= 48 * MiB
    assert rec["commit"] and rec["cpu"] and "memory_limit --limit 48MiB" in rec["command"]


def test_kvpot_reads_the_limit_and_refuses_in_one_line_rather_than_be_killed(tmp_path, smollm2_path):
    # the same read, kvpot left to find its memory: the cgroup's room (kvpot.session.memory_cgroup) is what it plans with
    res, rec = limited("48MiB", tmp_path, smollm2_path)
    assert not rec["killed"] and rec["oom_kills"] == 0 and rec["returncode"] == 1, res.stderr
    said = [json.loads(ln) for ln in rec["stderr_tail"] if ln.startswith('{"error"')]  # --json's error, on stderr
    assert len(said) == 1 and said[0]["exit_code"] == 1 and "is available" in said[0]["error"], rec["stderr_tail"]


def test_a_generous_limit_holds_and_the_read_answers(tmp_path, smollm2_path):
    res, rec = limited("2GiB", tmp_path, smollm2_path)
    assert res.returncode == 0, res.stderr
    lines = runner_lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("held within the memory limit of 2,048 MiB"), res.stderr
    assert not rec["killed"] and rec["oom_kills"] == 0 and rec["returncode"] == 0
    assert isinstance(rec["result"], dict) and rec["result"].get("answer") is not None, rec["stdout_tail"]
    assert any("tokens" in ln for ln in rec["stderr_tail"]), rec["stderr_tail"]  # kvpot's progress, kept
    # the read took memory, all of it charged inside the limit
    assert rec["peak_rss_bytes"] > 48 * MiB
    assert rec["peak_charged_bytes"] is None or 48 * MiB < rec["peak_charged_bytes"] <= 2048 * MiB


def test_a_time_bound_stops_the_command_and_is_recorded(tmp_path):
    out = tmp_path / "bound.json"
    res = subprocess.run([sys.executable, "-m", "kvpot.bench.memory_limit", "--limit", "256MiB", "--seconds", "1",
                          "--json", str(out), "--", sys.executable, "-c",
                          "import sys, time\nprint('started', file=sys.stderr, flush=True)\ntime.sleep(60)"],
                         capture_output=True, text=True, timeout=60)
    rec = json.loads(out.read_text())
    assert res.returncode == 0, res.stderr
    assert rec["stopped_after"] == 1 and rec["returncode"] == -15 and not rec["killed"]
    assert rec["stderr_tail"] == ["started"] and rec["seconds"] < 30
    assert runner_lines(res.stderr) == [res.stderr.strip().splitlines()[-1]]


def test_no_command_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "kvpot.bench.memory_limit", "--limit", "1GiB", "--"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip() == "error: no command to run: give it after --"
