"""llama.cpp's log goes through kvpot's filter written in C (ggml_ext/kvpot-log.cpp), never through a
Python callback: a ctypes callback must take the interpreter lock for every message from whatever thread
logs it, which can crash a process whose backend logs while the interpreter exits (issue 16)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import pytest

from kvpot.errors import KvpotError
from kvpot.runtime import logs
from kvpot.runtime.library import load

# ggml_log_level
NONE, DEBUG, INFO, WARN, ERROR, CONT = 0, 1, 2, 3, 4, 5


@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "llama.log"
    logs.install(path)
    yield path
    logs.install("")  # the file off again for the rest of the session


def _installed_callback(lib) -> int:
    cb, ud = ctypes.c_void_p(), ctypes.c_void_p()
    lib.llama_log_get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    lib.llama_log_get.restype = None
    lib.llama_log_get(ctypes.byref(cb), ctypes.byref(ud))
    return cb.value


def test_the_installed_log_callback_is_the_c_filter(smol):
    """After a model load (which installs the filter), llama.cpp's and ggml's callback is the C
    function kvpot_log_filter itself, not a ctypes thunk into Python."""
    lib = load()
    assert _installed_callback(lib) == ctypes.cast(lib.kvpot_log_filter, ctypes.c_void_p).value


def test_errors_reach_stderr_the_rest_only_the_file(log_file, capfd):
    lib = load()
    emit = lib.kvpot_log_filter
    emit(INFO, b"load: an info line\n", None)
    emit(WARN, b"a warning\n", None)
    emit(ERROR, b"real failure: ", None)
    emit(CONT, b"continued\n", None)  # a CONT piece follows its message
    emit(ERROR, b"token 1 was not control-type; this is probably a bug in the model\n", None)
    emit(CONT, b"harmless tail\n", None)
    emit(DEBUG, b"debug ", None)
    emit(CONT, b"debug tail\n", None)
    err = capfd.readouterr().err
    assert err == "real failure: continued\n"
    assert log_file.read_text() == ("load: an info line\na warning\nreal failure: continued\n"
                                    "token 1 was not control-type; this is probably a bug in the model\n"
                                    "harmless tail\ndebug debug tail\n")


def test_messages_from_many_threads_arrive_whole(log_file, capfd):
    """ctypes releases the interpreter lock around the C call, so these threads log at the same time
    inside the filter, as backend threads do."""
    lib = load()
    n_threads, n_lines = 8, 400

    def worker(t: int) -> None:
        for i in range(n_lines):
            lib.kvpot_log_filter(INFO, f"thread {t} line {i}\n".encode(), None)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    got = log_file.read_text().splitlines()
    want = {f"thread {t} line {i}" for t in range(n_threads) for i in range(n_lines)}
    assert len(got) == len(want) and set(got) == want
    assert capfd.readouterr().err == ""


def test_the_load_log_reaches_the_file_and_not_stderr(smollm2_path, log_file, capfd):
    from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel

    with LlamaModel(str(smollm2_path)) as m, LlamaContext(m, ContextParams(n_ctx=256, n_batch=64, n_threads=1)):
        pass
    text = log_file.read_text()
    assert "llama_model_loader" in text and "KV buffer size" in text
    assert capfd.readouterr().err == ""


def test_an_unwritable_log_file_is_one_error(tmp_path):
    with pytest.raises(KvpotError, match="folder .* does not exist"):  # checked before C opens it
        logs.install(tmp_path / "no" / "such" / "dir" / "llama.log")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root writes anyway
            with pytest.raises(KvpotError, match="cannot open log file"):  # C's own refusal, one line
                logs.install(locked / "llama.log")
    finally:
        locked.chmod(0o700)
    logs.install("")


def test_kvpot_llama_log_names_the_file_for_users(smollm2_path, tmp_path):
    """A fresh process with KVPOT_LLAMA_LOG set writes llama.cpp's whole log there."""
    path = tmp_path / "user.log"
    code = ("from kvpot.runtime.llama import LlamaModel\n"
            f"LlamaModel({str(smollm2_path)!r}, vocab_only=True).close()\n")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KVPOT_LLAMA_LOG": str(path)},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "llama_model_loader" in path.read_text()
    assert res.stderr == ""


def test_an_unwritable_kvpot_llama_log_names_the_variable(smollm2_path, tmp_path):
    code = f"from kvpot.runtime.llama import LlamaModel\nLlamaModel({str(smollm2_path)!r}, vocab_only=True)\n"
    env = {**os.environ, "KVPOT_LLAMA_LOG": str(tmp_path / "no" / "dir" / "x.log")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "KVPOT_LLAMA_LOG=" in res.stderr and "does not exist" in res.stderr
