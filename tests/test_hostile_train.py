"""Hostile options and outputs of `kvpot train` and `kvpot convert`: every option and output path is
refused in one line before any work, and an adapter is written whole or not at all (a full disk, here
the file-size limit, leaves neither a partial file nor a temporary one, and an existing file as it was)."""

from __future__ import annotations

import os
import resource
import signal

import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.converters.adapter import BaseIdentity, MemoryGate, RetainingHeads, write_memory_gate, write_retaining_heads
from kvpot.errors import KvpotError
from kvpot.session.checks import cpu_cores

BASE = BaseIdentity(arch="llama", n_layer=2, n_head=2, n_head_kv=1, head_dim_k=8, head_dim_v=8, n_embd=16,
                    sha256="ab" * 32)


def _heads(hidden: int = 64) -> RetainingHeads:
    rng = np.random.default_rng(0)
    return RetainingHeads(base=BASE, activation="silu",
                          fc1=[rng.standard_normal((hidden, BASE.qkv_width())).astype(np.float32) for _ in range(2)],
                          fc2=[rng.standard_normal((1, hidden)).astype(np.float32) for _ in range(2)])


def _gate(d_h: int = 256) -> MemoryGate:
    return MemoryGate.initial([0, 1], BASE.head_dim_v, BASE.n_head, d_h=d_h, base=BASE)


def _leftovers(folder, name: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n != name and name in n)


# -- options, before any work --------------------------------------------------------------------

@pytest.mark.parametrize("method", ["locret", "edgeinfinite"])
def test_threads_beyond_the_cores_are_refused(method, smollm2_path, tmp_path):
    out = tmp_path / "a.gguf"
    for threads, needle in ((cpu_cores() + 1, "CPU cores"), (0, "at least 1")):
        res = run_cli("train", method, "-m", str(smollm2_path), "-o", str(out), "--threads", str(threads))
        assert res.returncode != 0
        assert_one_line_error(res.stderr, needle)
    assert not out.exists()


def test_locret_cache_must_be_a_usable_folder(smollm2_path, tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("not a folder\n")
    for cache, needle in (("/dev/null", "not a folder"), (str(plain), "not a folder"),
                          (str(plain / "sub"), "cannot make the folder")):
        res = run_cli("train", "locret", "-m", str(smollm2_path), "-o", str(tmp_path / "h.gguf"), "--cache", cache)
        assert res.returncode != 0
        assert_one_line_error(res.stderr, needle)
    assert plain.read_text() == "not a folder\n"


def _bad_outputs(tmp_path, model) -> list[tuple[str, str]]:
    folder = tmp_path / "adir.gguf"
    folder.mkdir(exist_ok=True)
    return [(str(tmp_path / "missing" / "a.gguf"), "does not exist"), (str(folder), "is a directory"),
            ("/dev/full", "expected a .gguf"), (str(model), "which this command reads")]


def test_train_outputs_are_checked_before_training(smollm2_path, tmp_path):
    """A missing folder, a directory, a device or the model itself: one line, nothing touched."""
    size, mtime = smollm2_path.stat().st_size, smollm2_path.stat().st_mtime_ns
    for method, cases in (("edgeinfinite", slice(None)), ("locret", slice(1, None, 2))):
        for out, needle in _bad_outputs(tmp_path, smollm2_path)[cases]:
            res = run_cli("train", method, "-m", str(smollm2_path), "-o", out, "--steps", "1")
            assert res.returncode != 0, (method, out)
            assert_one_line_error(res.stderr, needle)
    assert (smollm2_path.stat().st_size, smollm2_path.stat().st_mtime_ns) == (size, mtime)
    assert (tmp_path / "adir.gguf").is_dir() and not (tmp_path / "missing").exists()


def test_train_refuses_a_device_named_like_an_adapter(tmp_path):
    from kvpot.converters.adapter import check_adapter_output

    dev = tmp_path / "full.gguf"
    os.symlink("/dev/full", dev)
    with pytest.raises(KvpotError, match="not a regular file"):
        check_adapter_output(dev)


def test_convert_output_is_checked_before_reading(smollm2_path, tmp_path):
    """The checkpoint does not exist: a bad output is what is said, so it was checked first."""
    for out, needle in _bad_outputs(tmp_path, smollm2_path):
        res = run_cli("convert", "locret", str(tmp_path / "absent.bin"), "-m", str(smollm2_path), "-o", out)
        assert res.returncode != 0
        assert_one_line_error(res.stderr, needle)


def test_convert_never_writes_over_its_checkpoint(smollm2_path, tmp_path):
    ckpt = tmp_path / "heads.gguf"  # a checkpoint that happens to have the adapter's suffix
    ckpt.write_bytes(b"PK\x05\x06" + bytes(18))
    before = ckpt.read_bytes()
    res = run_cli("convert", "locret", str(ckpt), "-m", str(smollm2_path), "-o", str(ckpt))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "which this command reads")
    assert ckpt.read_bytes() == before


# -- writing: whole or not at all ------------------------------------------------------------------

class _FileSizeLimit:
    """RLIMIT_FSIZE for this process while in the block: a write past it fails as on a full disk."""

    def __init__(self, limit: int):
        self.limit = limit

    def __enter__(self):
        self.old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        self.old_signal = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.old_limit[1]))

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_FSIZE, self.old_limit)
        signal.signal(signal.SIGXFSZ, self.old_signal)


@pytest.mark.parametrize("kind", ["heads", "gate"])
def test_a_write_that_fails_leaves_nothing_behind(kind, tmp_path):
    write = {"heads": lambda p: write_retaining_heads(p, _heads()), "gate": lambda p: write_memory_gate(p, _gate())}[kind]
    whole = tmp_path / "whole.gguf"
    write(whole)
    limit = whole.stat().st_size // 2
    new, old = tmp_path / "new.gguf", tmp_path / "old.gguf"
    old.write_bytes(b"the user's file\n")
    for target in (new, old):
        with pytest.raises(KvpotError) as info, _FileSizeLimit(limit):
            write(target)
        assert "\n" not in str(info.value) and str(info.value).startswith("cannot save the adapter")
        assert _leftovers(tmp_path, target.name) == []
    assert not new.exists() and old.read_bytes() == b"the user's file\n"
