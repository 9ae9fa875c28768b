"""llama.cpp's RPC backend: use the devices of other processes or machines (`kvpot ask --rpc`).

A client registers each server's devices before the model loads; llama.cpp then spreads the
model's layers (and their part of the KV cache, i.e. the pot) over them, and every graph kvpot adds
(compaction, taps, log-probs) runs through the same scheduler. ggml-rpc aborts the process when a
server cannot be reached, so every endpoint is checked here first, with the same hello the client
sends, and refused with one line.

A server that goes away later (stopped, crashed, its machine gone) makes ggml-rpc abort the client
from inside a send or receive (GGML_ABORT, which cannot return), by default with a debugger's
backtrace on stdout. `use_servers` installs ggml's abort callback first: an abort raised by the RPC
backend becomes one `error:` line on stderr naming the server (a JSON object under the CLI's
--json) and exit status RPC_LOST_EXIT. Nothing is saved at that point, unlike after a Ctrl-C: the
layers and the part of the pot that server held are gone with it, and the thread that met the
failure cannot hand control back to the reading loop (the caller waits on a reply that will never
come).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import signal
import socket
import struct
import sys

from kvpot.errors import KvpotError
from kvpot.runtime import devices
from kvpot.runtime.library import HOW_TO_BUILD
from kvpot.runtime.library import load as load_runtime

# ggml-rpc.cpp / ggml-rpc.h of the pinned llama.cpp: the hello command, its request (the
# connection capabilities, 24 bytes) and its reply (major, minor, patch, pad, capabilities)
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_MAJOR = 7
RPC_PROTO_MINOR = 0
CONNECT_TIMEOUT_S = 5.0

# the exit status of a process whose RPC server went away mid-run (1: a user error, 5: no answer,
# 130: Ctrl-C, 134 would be the abort this replaces)
RPC_LOST_EXIT = 6

class RpcError(KvpotError):
    """An RPC endpoint that cannot be used, or a runtime built without RPC."""


def parse_endpoints(spec: str) -> list[str]:
    """'HOST:PORT[,HOST:PORT...]' -> ['HOST:PORT', ...]; refuses anything else in one line."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcError(f"--rpc wants HOST:PORT[,HOST:PORT...], got {part!r}")
        out.append(part)
    if len(set(out)) != len(out):
        raise RpcError(f"--rpc lists a server twice: {spec}")
    return out


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise ConnectionError("the server closed the connection")
        buf += got
    return buf


def probe(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect and exchange the RPC hello; returns the server's protocol version or raises RpcError."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(s, 8))
            if size != 4 + RPC_CONN_CAPS_SIZE:
                raise RpcError(f"{endpoint} is not an RPC server of this llama.cpp (hello reply of {size} bytes)")
            major, minor, patch = struct.unpack("<BBB", _recv_exact(s, size)[:3])
    except RpcError:
        raise
    except socket.timeout:
        raise RpcError(f"RPC server {endpoint} did not answer within {timeout:g} s "
                       "(is it running, and serving no other client?)") from None
    except (OSError, ConnectionError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise RpcError(f"cannot reach RPC server {endpoint}: {reason}") from None
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        raise RpcError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this runtime "
                       f"{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}; run the same kvpot/llama.cpp build on both ends")
    return major, minor, patch


def _ggml_libs():
    """(ggml, ggml-rpc) symbols, looked up through the libllama that llama_cpp loaded (runtime.devices)."""
    lib = load_runtime()
    if "RPC" not in lib.kvpot_backends().decode().split(","):
        raise RpcError(f"this runtime was built without llama.cpp's RPC backend; {HOW_TO_BUILD} "
                       "(kvpot's build adds -DGGML_RPC=ON)")
    ggml = rpc = devices.ggml()
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    return ggml, rpc


# endpoints registered in this process (a device registry entry cannot be removed)
_registered: list[str] = []
# each endpoint's addresses (IP, port), to tell which server's connection closed
_addresses: dict[str, set[tuple[str, int]]] = {}
# the endpoints being registered now: an abort in ggml_backend_rpc_add_server is theirs
_connecting: list[str] = []


def registered() -> list[str]:
    """The endpoints whose devices this process has registered."""
    return list(_registered)


def use_servers(endpoints: list[str]) -> list[str]:
    """Register the devices of these RPC servers for every model loaded afterwards in this process.

    Returns the names of the devices now registered. llama.cpp puts RPC devices first and splits
    the layers over all devices by their free memory. From here on a server that goes away ends the
    process with one line and RPC_LOST_EXIT (see the module's docstring)."""
    ggml, rpc = _ggml_libs()
    for ep in endpoints:
        probe(ep)
    watch_for_lost_servers(ggml)
    for ep in endpoints:
        if ep in _registered:
            continue
        _addresses[ep] = _resolve(ep)
        _connecting[:] = [ep]
        try:
            reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        finally:
            _connecting.clear()
        if not reg:
            raise RpcError(f"RPC server {ep} offers no device")
        ggml.ggml_backend_register(reg)
        _registered.append(ep)
    return [d.name for d in devices.devices()]


# --- a server lost mid-run: ggml's abort callback ------------------------------------------------

_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_abort_callback = None  # the ctypes callback object, kept alive for the life of the process
_previous_callback = None  # whoever had the callback before (none in kvpot), for ggml's other aborts
_print_backtrace = None
# "<path>/ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response"
_RPC_ABORT = re.compile(r"ggml-rpc[^:/\\]*\.cpp:\d+: (.*)", re.S)


def watch_for_lost_servers(ggml=None) -> None:
    """Install ggml's abort callback (once per process): an abort from the RPC backend ends the
    process with one line and RPC_LOST_EXIT; any other abort is reported as ggml reports it."""
    global _abort_callback, _previous_callback, _print_backtrace
    if _abort_callback is not None:
        return
    if ggml is None:
        ggml, _ = _ggml_libs()
    ggml.ggml_set_abort_callback.restype = ctypes.c_void_p
    ggml.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]
    _print_backtrace = getattr(ggml, "ggml_print_backtrace", None)
    if _print_backtrace is not None:
        _print_backtrace.restype = None
        _print_backtrace.argtypes = []
    _abort_callback = _ABORT_CALLBACK(_on_ggml_abort)
    prev = ggml.ggml_set_abort_callback(_abort_callback)
    if prev:
        _previous_callback = _ABORT_CALLBACK(prev)


def _on_ggml_abort(message: bytes | None) -> None:
    """Runs in the thread that met the failure (ggml-rpc's dispatcher thread, mostly) with the GIL
    taken by ctypes; returning lets ggml call abort()."""
    try:
        text = (message or b"").decode(errors="replace").strip()
        m = _RPC_ABORT.search(text)
        if m is None:
            if _previous_callback is not None:
                _previous_callback(message)
                return
            # ggml's own report of an abort that is not an RPC failure, then abort() and the crash banner
            os.write(2, text.encode() + b"\n")
            if _print_backtrace is not None:
                _print_backtrace()
            return
        line = lost_server_message(m.group(1).strip())
    except BaseException:  # noqa: BLE001 - the process ends here whatever happens
        line = "an RPC server went away (its connection failed); nothing could be saved"
    _say_and_exit(line)


def lost_server_message(reason: str) -> str:
    """The one line for an abort raised by ggml-rpc with this reason."""
    closed = "RPC server crashed" in reason or "Failed to connect" in reason or "handshake failed" in reason
    if _connecting:
        what = "closed the connection" if closed else f"failed ({reason})"
        return (f"RPC server {_connecting[0]} answered the hello, then {what} while its devices were "
                "being registered; is it a `kvpot rpc-server` of this build?")
    named = re.search(r"(?:Failed to connect to|RPC handshake failed for) (\S+)", reason)
    lost = [named.group(1)] if named else _lost_endpoints()
    if len(lost) == 1:
        who = f"RPC server {lost[0]}"
    elif lost:
        who = f"an RPC server (one of {', '.join(lost)})"
    else:
        who = "an RPC server"
    gone = ("nothing could be saved: the model layers and the part of the pot it held went with it "
            "(run again once it is back, or without it)")
    if closed:
        return (f"lost {who}: its connection closed or broke mid-run (the server stopped, crashed or its "
                f"machine went away); {gone}")
    # an assertion of the RPC client: the server answered something it cannot go on from
    return f"{who} failed mid-run ({reason}); {gone}"


def _say_and_exit(line: str) -> None:
    """The one line on stderr (as JSON under the CLI's --json), then the end of the process: no
    atexit, no flushing of stdout (an unfinished answer is not the answer)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    common = sys.modules.get("kvpot.cli._common")
    if getattr(common, "_json_errors", False):
        out = json.dumps({"error": line, "exit_code": RPC_LOST_EXIT}) + "\n"
    else:
        out = f"error: {line}\n"
    with contextlib.suppress(Exception):
        os.write(2, out.encode(errors="replace"))
    os._exit(RPC_LOST_EXIT)


def _resolve(endpoint: str) -> set[tuple[str, int]]:
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    return {(_plain_ip(ai[4][0]), int(port)) for ai in infos}


def _plain_ip(ip: str) -> str:
    ip = ip.split("%", 1)[0]
    return ip[7:] if ip.startswith("::ffff:") and "." in ip else ip


def _lost_endpoints() -> list[str]:
    """The registered endpoints this process holds no established TCP connection to (Linux's
    /proc; elsewhere, or when every one looks alive, all of them: the caller names them all)."""
    eps = list(_registered)
    if len(eps) <= 1:
        return eps
    conns = _tcp_connections()
    if conns is None:
        return eps
    alive = {addr for addr, state in conns if state == _TCP_ESTABLISHED}
    lost = [ep for ep in eps if not (_addresses.get(ep, set()) & alive)]
    return lost or eps


_TCP_ESTABLISHED = "01"
_TCP_LISTEN = "0A"


def _proc_addr(field: str) -> tuple[str, int]:
    """'0100007F:C350' (or the IPv6 form) of /proc/net/tcp -> ('127.0.0.1', 50000)."""
    hexip, hexport = field.split(":")
    raw = bytes.fromhex(hexip)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four 32-bit words, each in host (little-endian) order
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return _plain_ip(ip), int(hexport, 16)


def _proc_tcp(pid: str = "self") -> list[tuple[tuple[str, int], tuple[str, int], str, str]]:
    """(local, remote, state, inode) of every TCP socket in pid's network namespace."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9:
                rows.append((_proc_addr(f[1]), _proc_addr(f[2]), f[3], f[9]))
    return rows


def _socket_inodes(pid: str = "self") -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_connections() -> list[tuple[tuple[str, int], str]] | None:
    """(remote address, state) of this process's own TCP sockets; None where /proc cannot tell."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    mine = _socket_inodes()
    return [(remote, state) for _, remote, state, inode in _proc_tcp() if inode in mine]


# --- the server -----------------------------------------------------------------------------------


def _listen_host(host: str) -> str:
    """The IPv4 address ggml-rpc's server binds (it takes a dotted IPv4 address only)."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        socket.inet_aton(host)
        if host.count(".") == 3:
            return host
    except OSError:
        pass
    if ":" in host:
        raise RpcError(f"--host {host}: llama.cpp's RPC server listens on IPv4 only; give an IPv4 address "
                       "(127.0.0.1, 0.0.0.0 or this machine's)")
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise RpcError(f"--host {host}: no IPv4 address of that name on this machine's resolver") from None


def check_port(host: str, port: int) -> None:
    """Refuse, in one line, a port that llama.cpp's server could not listen on; the check binds and
    listens as it does (SO_REUSEADDR on, so a closed connection's TIME_WAIT does not refuse a port it
    can use) and closes at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise RpcError(f"port {port} on {host} is already in use{_port_holder(port)}; "
                               "stop that or choose another with --port") from None
            raise RpcError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _port_holder(port: int) -> str:
    """' (by pid N: its command line)' for the process listening on the port, where /proc tells."""
    try:
        inodes = {inode for local, _, state, inode in _proc_tcp() if state == _TCP_LISTEN and local[1] == port}
        if not inodes:
            return ""
        for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
            if _socket_inodes(pid) & inodes:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = ""
                cmd = cmd if len(cmd) <= 120 else cmd[:117] + "..."
                return f" (by pid {pid}: {cmd})" if cmd else f" (by pid {pid})"
        return " (by a process of another user)"
    except OSError:
        return ""


def serve(host: str, port: int, n_threads: int, device: str | None = None, say=print) -> None:
    """Serve this machine's device (a GPU if there is one, else the CPU) to RPC clients; never returns.

    Ctrl-C or SIGTERM ends the process. One client is served at a time."""
    ggml, rpc = _ggml_libs()
    devs = {d.name: d for d in devices.devices() if d.kind in ("CPU", "GPU", "IGPU")}
    if device is None:
        gpus = [n for n, d in devs.items() if d.kind != "CPU"]
        device = gpus[0] if gpus else next(n for n, d in devs.items() if d.kind == "CPU")
    if device not in devs:
        raise RpcError(f"no device {device!r} here; devices: {', '.join(devs)}")
    addr = _listen_host(host)
    check_port(addr, port)
    if not addr.startswith("127."):
        say(f"warning: serving on {host}: the RPC protocol has no authentication; expose it only on a trusted network")
    arr = (ctypes.c_void_p * 1)(devs[device].handle)
    # the server loop is C and never returns to Python: let the default handlers end the process
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rpc.ggml_backend_rpc_start_server(f"{addr}:{port}".encode(), None, n_threads, 1, arr)
    # taken between the check and the server's own bind, or another failure it printed above
    raise RpcError(f"the RPC server could not listen on {addr}:{port} (port in use?)")
