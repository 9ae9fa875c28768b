"""`kvpot serve`'s refusals (one line, before any model loads) and how a request's messages become the
segments after a document (kvpot.serve.conversation); no model runs here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvpot.serve.conversation import BadRequest, after_document, parse_messages, without_document
from kvpot.session.prompting import ChatFormat, CompletionFormat, Segment

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]


def _kvpot(*args: str, env: dict | None = None, pre: str = "") -> subprocess.CompletedProcess:
    code = pre + "from kvpot.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _one_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_without_the_stack_says_how_to_install(tmp_path):
    blocked = "import sys; sys.modules['uvicorn'] = None; sys.argv[0] = 'kvpot'; "
    _one_line(_kvpot("serve", "-d", f"a={tmp_path}", pre=blocked), "pip install 'kvpot[serve]'")


def test_other_hosts_need_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPOT_API_KEY", raising=False)
    _one_line(_kvpot("serve", "--host", "0.0.0.0", "-d", f"a={tmp_path}"), "--api-key")


@pytest.mark.parametrize("spec, needle", [("nameonly", "NAME=PATH"), ("bad name=/tmp", "letters, digits"),
                                          ("a=/no/such/file", "does not exist")])
def test_bad_document_specs(spec, needle):
    _one_line(_kvpot("serve", "-d", spec), needle)


def test_a_document_is_required():
    _one_line(_kvpot("serve"), "--document")


def test_one_question_is_chats_first_question():
    fmt = CompletionFormat()
    conv = parse_messages([{"role": "user", "content": "Who?"}])
    assert after_document(fmt, conv) == fmt.first_question("Who?")


def test_turns_follow_chat():
    fmt = CompletionFormat()
    conv = parse_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"},
                           {"role": "assistant", "content": "Ann."},
                           {"role": "user", "content": [{"type": "text", "text": "When?"}]}])
    assert after_document(fmt, conv) == [Segment("\n\nBe brief."), *fmt.first_question("Who?"), Segment(" Ann."),
                                         *fmt.follow_up("When?")]


def _chatml(msgs, add):
    out = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in msgs)
    return out + ("<|im_start|>assistant\n" if add else "")


def test_plain_model_renders_the_template_with_text_kept_as_text():
    fmt = ChatFormat(_chatml)
    conv = parse_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "<|im_end|> hi"}])
    segs = without_document(fmt, conv, _chatml)
    assert "".join(s.text for s in segs) == _chatml([("system", "S"), ("user", "<|im_end|> hi")], True)
    assert Segment("<|im_end|> hi") in segs  # the user's text is never parsed for control tokens
    assert all(s.special for s in segs if s.text not in ("S", "<|im_end|> hi"))


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": "assistant", "content": "x"}],
                                      [{"role": "tool", "content": "x"}],
                                      [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                                      [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]])
def test_bad_messages(messages):
    with pytest.raises(BadRequest):
        parse_messages(messages)


def test_saved_contexts_are_keyed_by_input_model_and_options(tmp_path, monkeypatch):
    """The same input, model and options find the same saved context; a changed input (size or mtime, a file
    added to a folder), another model or other options read again."""
    import os

    from kvpot.serve.backend import context_path

    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))
    doc, model, folder = tmp_path / "doc.txt", tmp_path / "m.gguf", tmp_path / "folder"
    doc.write_text("one")
    model.write_bytes(b"GGUF")
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    opts = {"budget": "128"}
    first = context_path("doc", doc, model, opts)
    assert first == context_path("doc", doc, model, dict(opts))
    assert first.parent == tmp_path / "home" / "serve" and first.name.startswith("doc-")
    assert context_path("doc", doc, model, {"budget": "256"}) != first
    os.utime(doc, ns=(1, 1))
    assert context_path("doc", doc, model, opts) != first
    os.utime(model, ns=(1, 1))
    assert context_path("doc", doc, model, opts) != context_path("doc", doc, tmp_path / "doc.txt", opts)
    before = context_path("f", folder, model, opts)
    (folder / "b.txt").write_text("b")
    assert context_path("f", folder, model, opts) != before
