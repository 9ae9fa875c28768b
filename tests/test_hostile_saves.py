"""A save never replaces a file the command uses: `--save-context` (and chat's `/save`) naming an
input (itself, a hard link, a symlink, a file of a directory input), the model, an adapter or an
InfLLM block store is refused before reading, with one line and a non-zero exit, and the file is
left byte for byte as it was. The refusal lives in the writer (kvpot.safe_write), so every save
path gets it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write, protect, protection_scope

runner = CliRunner()
FAST = ["--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1"]
SHIPPED = Path(__file__).resolve().parent.parent / "models"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(args: list[str], victim: Path, needle: str) -> None:
    """The command exits non-zero with one error line naming what the target is; victim unchanged."""
    before = _digest(victim) if victim.exists() else None
    res = runner.invoke(app, args)
    assert res.exit_code != 0, res.output
    assert_one_line_error(res.stderr, needle)
    assert "cannot save the context" in res.stderr
    assert (_digest(victim) if victim.exists() else None) == before


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("The strongbox code is 4417. The lighthouse keeper wrote it down on a Tuesday.\n" * 4)
    return path


@pytest.fixture(scope="module")
def model_copy(smollm2_path, tmp_path_factory) -> Path:
    """A model file of the test's own: a failed refusal must not harm the shared cache."""
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    shutil.copyfile(smollm2_path, path)
    return path


def test_save_over_the_input_itself(doc, model_copy):
    _refused(["ask", str(doc), "Q", "--save-context", str(doc), "-m", str(model_copy), *FAST], doc, "the input")


def test_save_over_a_hard_link_to_the_input(doc, model_copy, tmp_path):
    link = tmp_path / "hard.txt"
    os.link(doc, link)
    _refused(["ask", str(doc), "Q", "--save-context", str(link), "-m", str(model_copy), *FAST], doc, "the input")
    assert link.stat().st_ino == doc.stat().st_ino  # the link is not replaced either


def test_save_over_a_symlink_to_the_input(doc, model_copy, tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(doc)
    _refused(["ask", str(doc), "Q", "--save-context", str(link), "-m", str(model_copy), *FAST], doc, "the input")
    assert link.is_symlink()


def test_save_over_a_file_inside_a_directory_input(model_copy, tmp_path):
    folder = tmp_path / "docs"
    (folder / "deep").mkdir(parents=True)
    inner = folder / "deep" / "b.txt"
    (folder / "a.txt").write_text("first file of the folder\n" * 8)
    inner.write_text("second file, one level down\n" * 8)
    _refused(["ask", str(folder), "Q", "--save-context", str(inner), "-m", str(model_copy), *FAST], inner,
             "the input")


def test_save_over_the_model(doc, model_copy):
    _refused(["ask", str(doc), "Q", "--save-context", str(model_copy), "-m", str(model_copy), *FAST], model_copy,
             "the model")


@pytest.mark.parametrize("spec, shipped, needle", [
    ("locret:heads={}", "smollm2-135m.locret.gguf", "the retaining-heads adapter"),
    ("edgeinfinite:gate={}", "smollm2-135m.edgeinfinite.gguf", "the memory-gate adapter"),
])
def test_save_over_an_adapter(doc, model_copy, tmp_path, spec, shipped, needle):
    adapter = tmp_path / shipped
    shutil.copyfile(SHIPPED / shipped, adapter)
    _refused(["ask", str(doc), "Q", "--save-context", str(adapter), "-m", str(model_copy), *FAST,
              "--policy", spec.format(adapter)], adapter, needle)


def test_save_over_the_infllm_store(doc, model_copy, tmp_path):
    store = tmp_path / "blocks.kvblk"  # made while reading: protected by its name before it exists
    _refused(["ask", str(doc), "Q", "--save-context", str(store), "-m", str(model_copy), *FAST,
              "--policy", f"infllm:store={store}"], store, "the InfLLM block store")
    assert not store.exists()


def test_the_writer_refuses_every_name_of_a_protected_file(tmp_path):
    store = tmp_path / "s.kvblk"
    hard, soft = tmp_path / "hard", tmp_path / "soft"
    with protection_scope():
        protect(store, "the InfLLM block store")
        with pytest.raises(KvpotError, match="InfLLM block store"), atomic_write(store, "context") as f:
            f.write(b"x")
        store.write_bytes(b"blocks")  # the store, once made, keeps its protection through any name
        os.link(store, hard)
        soft.symlink_to(store)
        for name in (store, hard, soft):
            with pytest.raises(KvpotError, match="InfLLM block store"), atomic_write(name, "context") as f:
                f.write(b"x")
    assert store.read_bytes() == b"blocks" and soft.is_symlink()
    with atomic_write(hard, "context") as f:  # outside the command's scope nothing is protected
        f.write(b"x")
    assert hard.read_bytes() == b"x"


def test_chat_save_over_the_input_is_one_line_and_the_chat_goes_on(doc, smollm2_path, tmp_path):
    before = _digest(doc)
    script = f"/save {doc}\n/save {tmp_path / 'ok.kvctx'}\n/quit\n"
    res = runner.invoke(app, ["chat", str(doc), "-m", str(smollm2_path), *FAST], input=script)
    assert res.exit_code == 0, res.output
    refusals = [ln for ln in res.stderr.splitlines() if "error: " in ln]  # after the "you> " prompt
    assert len(refusals) == 1 and "it is the input" in refusals[0], res.stderr
    assert _digest(doc) == before
    assert (tmp_path / "ok.kvctx").stat().st_size > 0
