"""llama.cpp's RPC backend: use the devices of other processes or machines (`kvpot ask --rpc`).

A client registers each server's devices before the model loads; llama.cpp then spreads the
model's layers (and their part of the KV cache, i.e. the pot) over them, and every graph kvpot adds
(compaction, taps, log-probs) runs through the same scheduler. ggml-rpc aborts the process when a
server cannot be reached, so every endpoint is checked here first, with the same hello the client
sends, and refused with one line.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import struct

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


def registered() -> list[str]:
    """The endpoints whose devices this process has registered."""
    return list(_registered)


def use_servers(endpoints: list[str]) -> list[str]:
    """Register the devices of these RPC servers for every model loaded afterwards in this process.

    Returns the names of the devices now registered. llama.cpp puts RPC devices first and splits
    the layers over all devices by their free memory."""
    ggml, rpc = _ggml_libs()
    for ep in endpoints:
        probe(ep)
    for ep in endpoints:
        if ep in _registered:
            continue
        reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        if not reg:
            raise RpcError(f"RPC server {ep} offers no device")
        ggml.ggml_backend_register(reg)
        _registered.append(ep)
    return [d.name for d in devices.devices()]


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
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"warning: serving on {host}: the RPC protocol has no authentication; expose it only on a trusted network")
    arr = (ctypes.c_void_p * 1)(devs[device].handle)
    # the server loop is C and never returns to Python: let the default handlers end the process
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rpc.ggml_backend_rpc_start_server(f"{host}:{port}".encode(), None, n_threads, 1, arr)
    raise RpcError(f"the RPC server could not listen on {host}:{port} (port in use?)")
