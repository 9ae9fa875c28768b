"""`kvpot serve` through the real `openai` client: a server started in a subprocess on a free port, answering
over a document longer than the context it is read into (past the window, through the pot), checked against
the same question asked through the library (kvpot.session, greedy): as `kvpot chat` answers past the pot, from
the passages the default locator (bm25) finds read again with full attention, and with `--locator pot` from the
pot itself."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

KEY = "test-key-93"
QUESTION = "What is the code of the strongbox?"
LONG_QUESTION = "List the numbers from 1 to 300 separated by commas."
# a pot of 128 cells read in chunks of 64; -n 16 keeps the answer reserve (and the context) small
BUDGET, CHUNK, N_PREDICT = 128, 64, 16
OPTS = ["--budget", str(BUDGET), "--chunk", str(CHUNK), "-n", str(N_PREDICT), "--prompt-format", "completion",
        "--threads", "1"]


# the installed command, as a user runs it
KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]


def _document(path: Path) -> Path:
    lines = [f"Day {i}: the ship Marrow passed island {i * 7} and the cook counted {i * 3} barrels." for i in range(24)]
    lines.insert(12, "The captain set the code of the strongbox to 52445.")
    path.write_text("\n".join(lines) + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, key: str = KEY, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=300, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(args: list[str], home: Path, log: Path, timeout: float = 400) -> Served:
    port = _free_port()
    env = dict(os.environ, KVPOT_HOME=str(home), KVPOT_PROGRESS_EVERY="0")
    env.pop("KVPOT_API_KEY", None)
    with open(log, "w") as f:
        proc = subprocess.Popen([*KVPOT, "serve", "--port", str(port), *args],
                                stdout=subprocess.DEVNULL, stderr=f, env=env)
    served = Served(proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kvpot serve exited {proc.returncode}:\n{served.stderr()}")
        try:
            with urllib.request.urlopen(served.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return served
        except OSError:
            time.sleep(0.5)
    served.stop()
    raise AssertionError(f"kvpot serve did not start in {timeout}s:\n{served.stderr()}")


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> Path:
    return _document(tmp_path_factory.mktemp("serve-doc") / "logbook.txt")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-home")


@pytest.fixture(scope="module")
def server(smollm2_path, doc, home, tmp_path_factory):
    served = start(["-d", f"logbook={doc}", "-m", str(smollm2_path), "--api-key", KEY, *OPTS], home,
                   tmp_path_factory.mktemp("serve-log") / "stderr.txt")
    yield served
    served.stop()


def _library_answers(smollm2_path, doc, home, monkeypatch_module) -> dict[str, str]:
    """The question asked through the library, the document read with the server's options, greedy: "pot", the
    pot's own answer; "bm25", the focused read's (the passages bm25 locates, read again with full attention)."""
    from kvpot.cli._session import new_session
    from kvpot.session.focus import focus_for, why_not
    from kvpot.session.locating import locate_with
    from kvpot.session.session import Session

    monkeypatch_module.setenv("KVPOT_HOME", str(home / "reference"))
    session, sources = new_session([str(doc)], ["*"], str(smollm2_path), None, resettable=False, policy=None,
                                   budget=str(BUDGET), chunk=CHUNK, threads=1, prompt="completion",
                                   max_tokens=N_PREDICT, flash_attn=None, question_before=None)
    with session:
        session.read(sources)
        assert session.doc_tokens > session.engine.ctx.n_ctx  # past the context the model is given
        assert why_not(session) is None                        # so past the pot a focused read answers
        text, settings = focus_for(session, locate_with("bm25", session, QUESTION))
        pot = "".join(session.ask(QUESTION))
        with Session(session.facts, session.model_name, settings, resettable=False) as focused:
            focused.read(text)
            bm25 = "".join(focused.ask(QUESTION))
    assert pot.strip() and bm25.strip()
    return {"pot": pot, "bm25": bm25}


@pytest.fixture(scope="module")
def answers(smollm2_path, doc, home, monkeypatch_module) -> dict[str, str]:
    return _library_answers(smollm2_path, doc, home, monkeypatch_module)


@pytest.fixture(scope="module")
def reference(answers) -> str:
    return answers["bm25"]


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _ask(client, model="kvpot:logbook", question=QUESTION, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], **kw)


def test_models_listed(server, smollm2_path):
    ids = [m.id for m in server.client().models.list().data]
    assert ids == [smollm2_path.stem, "kvpot:logbook"]


def test_document_past_the_window_is_served(server, reference):
    """The document is longer than the context it was read into: the pot held it at the budget."""
    log = server.stderr()
    ctx = int(re.search(r"budget 128 cells \(context ([\d,]+)\)", log)[1].replace(",", ""))
    read = re.search(r"read ([\d,]+) tokens in .*pot ([\d,]+) cells, ([\d,]+) compaction", log)
    tokens, cells, compactions = (int(g.replace(",", "")) for g in read.groups())
    assert tokens > ctx and cells <= ctx and compactions >= 1
    reply = _ask(server.client(), temperature=0)
    assert reply.choices[0].message.content == reference
    assert re.search(r"focused read of \d+ passages \([\d,]+ tokens\) for kvpot:logbook", server.stderr())
    assert reply.usage.completion_tokens >= 1


def test_answer_equals_the_library(server, reference):
    reply = _ask(server.client(), temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_stream_joins_to_the_answer(server, reference):
    chunks = list(_ask(server.client(), stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_raw_stream_ends_with_done(server):
    req = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "kvpot:logbook", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_unknown_model_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        _ask(server.client(), model="kvpot:nothing")
    assert e.value.status_code == 404 and e.value.body["code"] == "model_not_found"


def test_bad_body_400(server):
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model="kvpot:logbook", messages=[])
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(model="kvpot:logbook", messages=[{"role": "user", "content": "hi"}],
                                                temperature=5)
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=b"{not json", method="POST",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "error" in json.loads(e.value.read())


def test_api_key_401(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").models.list()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "/v1/models", timeout=30)
    assert e.value.code == 401 and json.loads(e.value.read())["error"]["code"] == "invalid_api_key"


def test_requests_leave_the_document_as_read(server, reference, smollm2_path):
    """A multi-turn conversation and a plain-model request between two questions: the second answer is the
    first (the document's state is restored before each request)."""
    client = server.client()
    turns = client.chat.completions.create(model="kvpot:logbook", temperature=0, messages=[
        {"role": "system", "content": "Answer from the logbook."},
        {"role": "user", "content": "Who passed island 14?"}, {"role": "assistant", "content": "The Marrow."},
        {"role": "user", "content": "How many barrels on day 3?"}])
    assert turns.choices[0].message.content is not None
    plain = client.chat.completions.create(model=smollm2_path.stem, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert plain.choices[0].message.content is not None
    assert plain.usage.prompt_tokens < 64  # no document before it
    assert _ask(client, temperature=0).choices[0].message.content == reference


def test_disconnect_mid_stream_does_not_wedge(server, reference, smollm2_path):
    """A client that closes a stream mid-answer cancels it (the server says so on stderr); the next request
    answers, over the document as read."""
    client = server.client()
    # a long answer on one line (the completion prompt ends an answer at its line's end): 1, 2, 3, ...
    stream = client.chat.completions.create(model=smollm2_path.stem, stream=True, max_tokens=400, temperature=0,
                                            messages=[{"role": "user", "content": LONG_QUESTION}])
    chunks = iter(stream)
    assert next(chunks).choices[0].delta.role == "assistant"
    assert next(chunks).choices[0].delta.content  # the answer has begun; then the client goes away
    stream.close()
    assert _ask(client, temperature=0).choices[0].message.content == reference
    assert server.stderr().count("(cancelled: the client went away)") == 1
    # the same without streaming: the connection dropped while the answer is made
    body = json.dumps({"model": smollm2_path.stem, "max_tokens": 400, "temperature": 0,
                       "messages": [{"role": "user", "content": LONG_QUESTION}]}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        time.sleep(2)
    assert _ask(client, temperature=0).choices[0].message.content == reference
    assert server.stderr().count("(cancelled: the client went away)") == 2


def test_concurrent_requests_queue(server, reference):
    answers: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            answers.append(_ask(server.client(), temperature=0).choices[0].message.content)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and answers == [reference, reference]


def test_restart_reopens_the_saved_context(server, reference, smollm2_path, doc, home, tmp_path):
    """A second server over the same document and model reopens the first one's context instead of reading."""
    again = start(["-d", f"logbook={doc}", "-m", str(smollm2_path), *OPTS], home, tmp_path / "stderr.txt")
    try:
        log = again.stderr()
        assert "reopened" in log and "reading" not in log
        assert _ask(again.client(key="any"), temperature=0).choices[0].message.content == reference
    finally:
        again.stop()


def test_locator_pot_serves_the_pots_answer(smollm2_path, doc, home, answers, tmp_path):
    """--locator pot: no focused read; the pot answers, as the library's pot does."""
    pot = start(["-d", f"logbook={doc}", "-m", str(smollm2_path), "--locator", "pot", *OPTS], home,
                tmp_path / "stderr.txt")
    try:
        assert _ask(pot.client(key="any"), temperature=0).choices[0].message.content == answers["pot"]
        assert "focused read" not in pot.stderr()
    finally:
        pot.stop()
