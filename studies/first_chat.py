"""A new user's first chat over a long file: `kvpot chat FILE` with no flag beyond the file (issue 93's goal),
questions typed in turn, each sent once the previous answer has ended, as a person at the terminal does.

The file is one joined input of the question set (kvpot.bench.qa_inputs, no multi-key needles), so the answers
can be scored (strictly, kvpot.bench.qa_score.strict); the model is what `kvpot chat` chooses with no `-m`
($KVPOT_MODEL is cleared). Recorded: everything kvpot said on stderr, the time until it asks for the first
question, and each answer with its wall time.

    python -m studies.first_chat --length 102400 --questions 4 --json docs/bench/qa/first-chat-100k.json
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvpot.bench.qa_score import question_facts, strict
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import write_text_file
from studies.answer_taps_speed import commit
from studies.serve_clients import one_input

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
READY = "ask about the document"
ANSWERED = "answered in"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.first_chat", description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=102400, help="tokens of the joined input")
    p.add_argument("--questions", type=int, default=4, help="answerable questions of that input asked in turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write the transcript and the figures here")
    return p


class Chat:
    """`kvpot chat` on pipes: stdout and stderr read as they come, with the time of each stderr line."""

    def __init__(self, args: list[str], env: dict):
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
        self.sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
        self.out, self.err_lines, self._err = b"", [], b""
        self.t0 = time.perf_counter()

    def until(self, marker: str) -> float:
        """Read both streams until a stderr line holds `marker`; the time since start. Exits where kvpot ended."""
        seen = len(self.err_lines)
        while True:
            for line in self.err_lines[seen:]:
                if marker in line[1]:
                    return line[0]
            seen = len(self.err_lines)
            if not self.sel.get_map():
                raise SystemExit(f"kvpot chat ended before '{marker}':\n" + "\n".join(t for _, t in self.err_lines[-20:]))
            for key, _ in self.sel.select(timeout=5):
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    self.sel.unregister(key.fileobj)
                    continue
                if key.data == "out":
                    self.out += data
                else:
                    self._err += data
                    *lines, self._err = self._err.replace(b"\r", b"\n").split(b"\n")
                    now = time.perf_counter() - self.t0
                    self.err_lines += [(now, ln.decode(errors="replace")) for ln in lines if ln.strip()]

    def drain(self, seconds: float = 1.0) -> None:
        """What kvpot wrote just before its last stderr line (the answer's end may arrive after its marker)."""
        deadline = time.perf_counter() + seconds
        while self.sel.get_map() and time.perf_counter() < deadline:
            for key, _ in self.sel.select(timeout=0.1):
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    self.sel.unregister(key.fileobj)
                elif key.data == "out":
                    self.out += data
                else:
                    self._err += data

    def send(self, line: str) -> float:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        return time.perf_counter() - self.t0


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    from kvpot.models.resolve import resolve_model
    from kvpot.session.default_model import MODEL_ENV, default_model

    env = dict(os.environ)
    env.pop(MODEL_ENV, None)
    os.environ.pop(MODEL_ENV, None)
    model = default_model()  # what `kvpot chat` will choose: the input is sized by its tokenizer
    facts, _ = resolve_model(model)
    joined, asks, by_id = one_input(facts.path, ns.length, ns.seed, ns.questions, "first-chat")
    cases = []
    with tempfile.TemporaryDirectory(prefix="kvpot-first-chat-") as tmp:
        path = Path(tmp) / "notes.txt"
        path.write_text(joined.text, encoding="utf-8")
        chat = Chat([*KVPOT, "chat", str(path)], env)
        try:
            ready = chat.until(READY)
            for a in asks:
                start, before = chat.send(a.question), len(chat.out)
                end = chat.until(ANSWERED)
                chat.drain()
                answer = chat.out[before:].decode(errors="replace").strip()
                q = by_id[a.id]
                cases.append({"id": a.id, "kind": q.kind, "question": a.question, "refs": list(a.refs),
                              "answer": answer, "correct": strict(answer, list(a.refs), a.question, **question_facts(q)),
                              "seconds": round(end - start, 1)})
                print(json.dumps({k: cases[-1][k] for k in ("id", "correct", "seconds")}), file=sys.stderr)
            chat.send("/quit")
            chat.proc.wait(60)
        finally:
            if chat.proc.poll() is None:
                chat.proc.kill()
                chat.proc.wait()
    out = {"command": "python -m studies.first_chat " + " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit(), "cpu": describe_host(), "kvpot_command": "kvpot chat notes.txt",
           "model": model, "length": ns.length, "input": joined.index, "ready_seconds": round(ready, 1),
           "right": sum(c["correct"] for c in cases), "n": len(cases), "cases": cases,
           "stderr": [t for _, t in chat.err_lines]}
    print(json.dumps({k: out[k] for k in ("model", "ready_seconds", "right", "n")}))
    if ns.json is not None:
        write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
