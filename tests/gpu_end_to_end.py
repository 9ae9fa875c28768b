"""kvpot as a user runs it, on whatever backend the runtime was built for (tests/cuda_end_to_end.sh runs it
on a CUDA GPU): `kvpot doctor`, a read past the model's window saved with --save-context, the saved context
reopened, a read stopped by SIGTERM and continued (--continue) whose answer must equal the uninterrupted
read's, and `kvpot bench throughput` for a few methods against stock llama.cpp in the same run.

The model is tests/synthetic_model.py's (a real model's shape and tokenizer, seeded weights: its answers
are noise, but the same noise for the same pot, which is what the stopped-and-continued check compares).

    python tests/gpu_end_to_end.py --skeleton SKELETON.gguf --work DIR --out DIR [--entries N] [-t N]

Every step's command, exit status, seconds and last stderr lines go to OUT/steps.json as it ends; the exit
status is 1 if a step failed."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
QUESTION = "What is the code of the strongbox?"


class Steps:
    def __init__(self, out: Path):
        self.out, self.steps, self.failed = out, [], False

    def record(self, name: str, cmd: list[str], rc: int, seconds: float, stderr: str, ok: bool, **extra) -> None:
        self.failed |= not ok
        self.steps.append(dict(name=name, cmd=cmd[len(KVPOT):] if cmd[:len(KVPOT)] == KVPOT else cmd, rc=rc,
                               seconds=round(seconds, 2), ok=ok, stderr_tail=stderr.splitlines()[-12:], **extra))
        (self.out / "steps.json").write_text(json.dumps(self.steps, indent=1))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rc {rc}, {seconds:.1f} s", flush=True)
        for line in stderr.splitlines()[-6:]:
            print(f"     {line}", flush=True)

    def run(self, name: str, args: list[str], ok_rc=(0,), timeout: float = 600, **extra) -> subprocess.CompletedProcess:
        cmd = KVPOT + args if args[0] != sys.executable else args
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            self.record(name, cmd, -1, time.perf_counter() - t0, f"timed out after {timeout} s\n{e.stderr or ''}", False)
            return subprocess.CompletedProcess(cmd, -1, "", "")
        self.record(name, cmd, p.returncode, time.perf_counter() - t0, p.stderr, p.returncode in ok_rc, **extra)
        return p


def stop_at(cmd: list[str], tokens: int, sig: int = signal.SIGTERM) -> tuple[int, str, float]:
    """Run `cmd`, send `sig` once a progress line says at least `tokens` were read; exit status, stderr, seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        m = re.match(r"read ([0-9,]+) of", line)
        if m and int(m[1].replace(",", "")) >= tokens:
            proc.send_signal(sig)
            break
    _, rest = proc.communicate(timeout=600)
    return proc.returncode, "".join(lines) + rest, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skeleton", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--entries", type=int, default=1000, help="logbook entries (1,000: ~43K tokens)")
    ap.add_argument("--stop-at", type=int, default=12000, help="tokens read before the SIGTERM")
    ap.add_argument("-t", "--threads", type=int, default=8)
    ap.add_argument("--bench-tokens", type=int, default=32768)
    ap.add_argument("--bench", default="infinipot,streaming,infllm", help="policies for bench throughput")
    ap.add_argument("--bench-timeout", type=float, default=180, help="seconds each bench may take")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    os.chdir(a.work)  # not the checkout's root, whose kvpot/ (without cli/) would shadow the assembled package
    s = Steps(a.out)
    t = ["-t", str(a.threads)]

    doctor = s.run("doctor", ["doctor"])
    (a.out / "doctor.txt").write_text(doctor.stdout + doctor.stderr)
    model = a.work / "synthetic.gguf"
    if not model.exists():
        s.run("synthetic model", [sys.executable, str(HERE / "synthetic_model.py"), "fill", a.skeleton, str(model)])
    sys.path.insert(0, str(HERE.parent))
    from kvpot.bench.logbook import logbook

    doc = a.work / "logbook.txt"
    doc.write_text(logbook(n_entries=a.entries)[0])
    m = ["-m", str(model)]

    # a read past the window, saved; its answer is the reference for the continued read below
    whole = s.run("read and save", ["ask", str(doc), QUESTION, *m, *t, "-n", "16", "--save-context",
                                    str(a.work / "whole.kvpot")])
    s.run("reopen", ["ask", "--context", str(a.work / "whole.kvpot"), "Who kept the logbook?", *t, "-n", "8"])

    stopped = a.work / "stopped.kvpot"
    cmd = KVPOT + ["ask", str(doc), QUESTION, *m, *t, "-n", "16", "--save-context", str(stopped)]
    rc, err, sec = stop_at(cmd, a.stop_at)
    s.record("read stopped by SIGTERM", cmd, rc, sec, err, rc == 128 + signal.SIGTERM and stopped.exists())
    cont = s.run("continued", ["ask", "--context", str(stopped), "--continue", QUESTION, *t, "-n", "16"])
    same = cont.returncode == 0 and whole.returncode == 0 and cont.stdout == whole.stdout
    s.record("continued answer equals the uninterrupted read's", [], 0, 0.0,
             f"uninterrupted: {whole.stdout!r}\ncontinued:     {cont.stdout!r}", same)

    for pol in a.bench.split(","):
        s.run(f"bench throughput {pol}", ["bench", "throughput", *m, "-P", pol, "--budget", "2048", "--tokens",
                                          str(a.bench_tokens), "--decode", "32", *t, "--flash-attn", "--json",
                                          str(a.out / f"throughput-{pol.split(':')[0]}.json")], timeout=a.bench_timeout)
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
