"""The pot through llama.cpp's RPC backend: two `kvpot rpc-server` processes on this machine hold the
model's layers and their part of the KV cache; taps, log-probs, compaction, the engine's choices and
the answer must equal a local run made in the same test (on SmolLM2 cut to 4 blocks, conftest.py: a
comparison of two paths through one model)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, assert_one_line_error, run_cli

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 60
SERVER_ARGS = ["-c", "from kvpot.cli.main import main; main()", "rpc-server", "--host", "127.0.0.1", "--threads", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Servers:
    """n rpc-server processes on ports chosen here; stopped (and waited for) on close."""

    def __init__(self, n: int, log_dir: Path):
        from kvpot.errors import KvpotError
        from kvpot.runtime.rpc import probe

        self.procs: list[subprocess.Popen] = []
        self.endpoints: list[str] = []
        self.logs: list[Path] = []
        try:
            for i in range(n):
                for attempt in range(3):  # a port taken between choosing and binding: choose again
                    port = _free_port()
                    log = log_dir / f"rpc-server-{i}-{attempt}.log"
                    with open(log, "w") as f:
                        proc = subprocess.Popen([sys.executable, *SERVER_ARGS, "--port", str(port)],
                                                stdout=f, stderr=subprocess.STDOUT)
                    deadline = time.monotonic() + START_TIMEOUT_S
                    up = False
                    while proc.poll() is None and time.monotonic() < deadline:
                        try:
                            probe(f"127.0.0.1:{port}", timeout=2)
                            up = True
                            break
                        except KvpotError:
                            time.sleep(0.2)
                    if up:
                        self.procs.append(proc)
                        self.endpoints.append(f"127.0.0.1:{port}")
                        self.logs.append(log)
                        break
                    self._stop(proc)
                else:
                    raise AssertionError(f"rpc-server {i} did not start; last log:\n{log.read_text()}")
        except BaseException:
            self.close()
            raise

    @property
    def spec(self) -> str:
        return ",".join(self.endpoints)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def close(self) -> None:
        for p in self.procs:
            self._stop(p)
        self.procs = []


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = Servers(2, tmp_path_factory.mktemp("rpc"))
    yield s
    s.close()


def _child(model: Path, out: Path, *extra: str) -> dict:
    cmd = [sys.executable, str(HERE / "rpc_child.py"), str(model), str(out), *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    return dict(np.load(out))


@pytest.fixture(scope="module")
def runs(servers, smollm2_cut_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("rpc-runs")
    local = _child(smollm2_cut_path, d / "local.npz")
    remote = _child(smollm2_cut_path, d / "rpc.npz", "--rpc", servers.spec, "--keep", str(d / "local.npz"))
    return local, remote


def test_rpc_run_puts_layers_and_pot_on_both_servers(runs, servers):
    local, remote = runs
    assert not any("RPC" in ln for ln in local["buffer_lines"])
    devs = [str(d) for d in remote["devices"]]
    assert [d for d in devs if d.startswith("RPC")] == ["RPC0", "RPC1"], devs
    lines = [str(ln) for ln in remote["buffer_lines"]]
    for ep in servers.endpoints:  # buffers are named RPC<device>[HOST:PORT]
        assert any(f"[{ep}]" in ln and "model buffer" in ln for ln in lines), lines
        assert any(f"[{ep}]" in ln and "KV buffer" in ln for ln in lines), lines  # the pot lives there too


def _close(got, want, rel=1e-4):
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= rel * scale, float(np.abs(got - want).max())


def test_rpc_taps_and_logprobs_equal_local(runs):
    local, remote = runs
    np.testing.assert_allclose(remote["taps"], local["taps"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(remote["logprobs"], local["logprobs"], rtol=1e-4, atol=1e-4)
    # the cells the taps rank highest are the same per head (the RPC run compacts with the local set)
    ranked = np.sort(np.argsort(-remote["taps"], axis=-1, kind="stable")[..., :local["keep"].shape[-1]], axis=-1)
    agree = (ranked == local["keep"]).all(axis=-1).mean()
    assert agree > 0.95, agree


def test_rpc_compaction_with_cr_rope_equals_local(runs):
    local, remote = runs
    assert (remote["stats"] == local["stats"]).all()
    _close(remote["read"], local["read"])       # per-head kept K (re-rotated) and V, read back over RPC
    _close(remote["logits"], local["logits"])   # and the next token's logits after the compaction


def test_rpc_engine_keeps_and_answers_like_local(runs):
    local, remote = runs
    assert local["engine_compactions"][0] >= 2
    assert (remote["engine_compactions"] == local["engine_compactions"]).all()
    assert remote["engine_positions"].shape == local["engine_positions"].shape
    assert (remote["engine_positions"] == local["engine_positions"]).all()
    assert bytes(remote["answer"]) == bytes(local["answer"]) and len(local["answer"]) > 0


def test_cli_ask_rpc_answers_like_local(servers, smollm2_cut_path, tmp_path):
    from kvpot.bench.logbook import logbook

    text, question, _ = logbook(n_entries=20, seed=3)
    doc = tmp_path / "log.txt"
    doc.write_text(text)
    args = ["ask", str(doc), question, "-m", str(smollm2_cut_path), "--policy", "infinipot:pot=384,keep=192",
            "--budget", "384", "--chunk", "128", "--n-predict", "16", "--threads", "1"]
    local = run_cli(*args)
    assert local.returncode == 0, local.stderr
    remote = run_cli(*args, "--rpc", servers.spec)
    assert remote.returncode == 0, remote.stderr
    assert f"RPC: {servers.endpoints[0]}, {servers.endpoints[1]}" in remote.stderr
    assert remote.stdout == local.stdout and local.stdout.strip()


def test_budget_auto_plans_with_the_rpc_devices_memory(servers):
    """With RPC servers registered, the layers and the pot go to their devices, so `--budget auto`
    plans with the memory those devices report (their ggml_backend_dev_memory), not this machine's RAM."""
    code = ("import json, sys\n"
            "from kvpot.runtime.rpc import parse_endpoints, use_servers\n"
            "from kvpot.runtime import devices\n"
            "from kvpot.session.auto_budget import device_memory\n"
            "use_servers(parse_endpoints(sys.argv[1]))\n"
            "rpc = [d for d in devices.devices() if d.backend == 'RPC']\n"
            "m = device_memory()\n"
            "print(json.dumps({'names': [d.name for d in rpc], 'free': [d.free_bytes for d in rpc],\n"
            "                  'plan_free': m.free_bytes, 'where': m.where}))\n")
    env = {k: v for k, v in os.environ.items() if k != "KVPOT_DEVICE_MEMORY"}
    res = subprocess.run([sys.executable, "-c", code, servers.spec], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert len(got["names"]) == 2 and all(n.startswith("RPC") for n in got["names"])
    assert all(f > 0 for f in got["free"])
    assert got["plan_free"] == sum(got["free"])
    assert all(n in got["where"] for n in got["names"]) and "RAM" not in got["where"]


def test_unreachable_rpc_server_is_one_line(smollm2_path, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("a short note")
    with socket.socket() as held:  # bound, never listening: nothing can answer on this port
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), "--rpc", f"127.0.0.1:{port}")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, f"cannot reach RPC server 127.0.0.1:{port}")


def test_silent_rpc_peer_is_one_line(smollm2_path, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("a short note")
    with socket.socket() as s:  # listening, never answering
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        port = s.getsockname()[1]
        res = run_cli("run", "-f", str(doc), "-p", "what?", "-m", str(smollm2_path), "--rpc", f"127.0.0.1:{port}")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, f"RPC server 127.0.0.1:{port} did not answer")


@pytest.mark.parametrize("spec", ["localhost", "host:0", "a:1,a:1", "h:port"])
def test_bad_rpc_spec_is_one_line(smollm2_path, tmp_path, spec):
    doc = tmp_path / "d.txt"
    doc.write_text("a short note")
    res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), "--rpc", spec)
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "--rpc")


def test_runtime_without_rpc_is_refused(monkeypatch):
    from kvpot.runtime import rpc

    class NoRpc:
        _name = str(REPO / "nowhere" / "libllama.so")

        @staticmethod
        def kvpot_backends():
            return b"CPU"

    monkeypatch.setattr(rpc, "load_runtime", lambda: NoRpc())
    with pytest.raises(rpc.RpcError, match="built without llama.cpp's RPC backend"):
        rpc.use_servers(["127.0.0.1:1"])


# --- a server that goes away ------------------------------------------------------------------------


class HelloThenClose:
    """A listener that answers each connection's RPC hello as a server of this protocol does, then
    closes the connection when the next command has come (a server that dies right after the handshake)."""

    def __init__(self):
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.hellos = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import struct

        from kvpot.runtime.rpc import RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE, RPC_PROTO_MAJOR, RPC_PROTO_MINOR, _recv_exact

        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.settimeout(10)
                    cmd, size = struct.unpack("<BQ", _recv_exact(conn, 9))
                    _recv_exact(conn, size)
                    if cmd != RPC_CMD_HELLO:
                        continue
                    conn.sendall(struct.pack("<QBBBB", 4 + RPC_CONN_CAPS_SIZE, RPC_PROTO_MAJOR, RPC_PROTO_MINOR, 0, 0)
                                 + bytes(RPC_CONN_CAPS_SIZE))
                    self.hellos += 1
                    # the next command whole (so the close is a FIN, not a reset for unread bytes), then close
                    _, size = struct.unpack("<BQ", _recv_exact(conn, 9))
                    _recv_exact(conn, size)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def _no_native_report(text: str) -> None:
    """No trace of ggml's abort: its message, a debugger's backtrace, kvpot's crash banner, a traceback,
    the transport's error line for the broken connection (kvpot-log.cpp drops it)."""
    for needle in ("ggml-rpc.cpp", "GGML_ASSERT", "Remote RPC server crashed", "crashed in native code",
                   "Traceback", "Fatal Python error", "#0 ", "[Inferior", "recv failed", "send failed"):
        assert needle not in text, text


@pytest.mark.parametrize("as_json", [False, True], ids=["line", "json"])
def test_rpc_server_that_closes_after_the_hello_is_one_line(smollm2_path, tmp_path, as_json):
    """The hello is answered (the check before the model loads passes), then the connection closes:
    ggml-rpc aborts inside the next command; kvpot's abort callback makes it one line, exit RPC_LOST_EXIT."""
    from kvpot.runtime.rpc import RPC_LOST_EXIT

    doc = tmp_path / "d.txt"
    doc.write_text("a short note")
    fake = HelloThenClose()
    try:
        res = run_cli("ask", str(doc), "what?", "-m", str(smollm2_path), "--rpc", fake.endpoint,
                      *(["--json"] if as_json else []), timeout=120)
    finally:
        fake.close()
    assert fake.hellos >= 2  # kvpot's check, then ggml-rpc's own connection
    assert res.returncode == RPC_LOST_EXIT, res.stderr
    assert res.stdout == ""
    _no_native_report(res.stderr)
    if as_json:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        got = json.loads(lines[0])
        assert got["exit_code"] == RPC_LOST_EXIT and f"RPC server {fake.endpoint}" in got["error"]
    else:
        assert_one_line_error(res.stderr, f"RPC server {fake.endpoint} answered the hello, then closed the connection")


def test_rpc_server_killed_mid_read_is_one_line(smollm2_cut_path, tmp_path):
    """A real server killed while `kvpot ask` reads through it: one error line naming it, saying nothing
    could be saved, exit RPC_LOST_EXIT (not ggml's SIGABRT, 134), nothing on stdout."""
    import signal

    from kvpot.bench.logbook import logbook
    from kvpot.runtime.rpc import RPC_LOST_EXIT

    text, question, _ = logbook(n_entries=120, seed=3)
    doc = tmp_path / "logbook.txt"
    doc.write_text(text)
    server = Servers(1, tmp_path)
    try:
        ep = server.endpoints[0]
        cmd = [sys.executable, *SERVER_ARGS[:2], "ask", str(doc), question, "-m", str(smollm2_cut_path),
               "--rpc", ep, "--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion",
               "--threads", "1", "--save-context", str(tmp_path / "never.kvpot")]
        env = {**os.environ, "KVPOT_PROGRESS_EVERY": "0"}  # a line after every chunk: the kill lands mid-read
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("read "):
                break
        server.procs[0].send_signal(signal.SIGKILL)
        out, rest = proc.communicate(timeout=300)
    finally:
        server.close()
    stderr = "".join(lines) + rest
    assert any(ln.startswith("read ") for ln in lines), stderr  # it was reading when the server died
    assert proc.returncode == RPC_LOST_EXIT, stderr
    assert out == ""
    _no_native_report(stderr)
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr
    assert f"lost RPC server {ep}" in errors[0] and "nothing could be saved" in errors[0], errors[0]
    assert not (tmp_path / "never.kvpot").exists()


def test_rpc_server_on_a_port_in_use_is_one_line():
    """`kvpot rpc-server` refuses a port another process listens on before it prints its banner, and
    says who holds it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = run_cli("rpc-server", "--host", "127.0.0.1", "--port", str(port), timeout=120)
    assert res.returncode != 0
    assert res.stdout == ""  # no banner
    assert_one_line_error(res.stderr, f"port {port} on 127.0.0.1 is already in use (by pid {os.getpid()}")
