"""The reader and the incremental tokenizer: lazy, equal to whole-text tokenization, flat memory."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from textgen import text_block, write_big_file

from kvpot.errors import KvpotError
from kvpot.ingest import IncrementalTokenizer, collect_sources


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def tokenizer_model(request, smollm2_path, gemma_path):
    from kvpot.runtime.llama import LlamaModel

    lm = LlamaModel(str(smollm2_path if request.param == "smollm2" else gemma_path))
    yield lm
    lm.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_streamed_tokens_equal_whole_text(tokenizer_model, seed):
    text = text_block(seed, 400_000)
    whole = tokenizer_model.tokenize(text)
    tok = IncrementalTokenizer(tokenizer_model.tokenize, min_piece=2000)
    pieces = [text[i:i + 3001] for i in range(0, len(text), 3001)]
    got = [t for ts in tok.stream(pieces) for t in ts]
    assert tok.hard_cuts == 0
    assert got == whole


def test_hard_cuts_only_change_tokens_near_the_cut(tokenizer_model):
    # one long run without spaces: the only cut possible is a hard one (documented exception)
    text = "x" * 50 + ("ab1" * 30_000) + " tail words here"
    tok = IncrementalTokenizer(tokenizer_model.tokenize, min_piece=100, max_hold=20_000)
    got = [t for ts in tok.stream([text[i:i + 1000] for i in range(0, len(text), 1000)]) for t in ts]
    assert tok.hard_cuts >= 1
    decoded = b"".join(tokenizer_model.piece(t) for t in got).decode()
    assert decoded == text  # nothing lost or added, only the split into tokens may differ
    whole = tokenizer_model.tokenize(text)
    assert abs(len(got) - len(whole)) <= 2 * tok.hard_cuts


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"good text \xff\xfe more \xc3 end\n" + "é".encode() * 10)
    src = collect_sources([str(p)])
    text = "".join(src.pieces(piece_bytes=7))  # pieces split multibyte characters too
    assert text == b"good text \xff\xfe more \xc3 end\n".decode("utf-8", errors="replace") + "é" * 10
    assert src.replaced == 3


def test_sources_join_files_with_headers_and_skip_binary(tmp_path):
    d = tmp_path / "proj"
    (d / "sub").mkdir(parents=True)
    (d / "a.py").write_text("print('a')\n")
    (d / "sub" / "b.py").write_text("print('b')\n")
    (d / "notes.md").write_text("notes\n")
    (d / "blob.py").write_bytes(b"\x00\x01\x02" * 100)
    (d / ".git").mkdir()
    (d / ".git" / "c.py").write_text("hidden\n")
    seen = []
    src = collect_sources([str(d)], glob="*.py", notice=seen.append)
    assert [s.name for s in src.sources] == [str(d / "a.py"), str(d / "sub" / "b.py")]
    assert src.skipped == [str(d / "blob.py")] and "binary" in seen[0]
    text = "".join(src.pieces())
    assert f"===== {d / 'a.py'} =====" in text and "print('b')" in text and "hidden" not in text


@pytest.mark.parametrize("setup, needle", [
    (lambda d: d.mkdir(), "has no text files"),
    (lambda d: (d.mkdir(), (d / "x.bin").write_bytes(b"\x00" * 10)), "has no text files"),
])
def test_directory_without_text_is_refused(tmp_path, setup, needle):
    d = tmp_path / "d"
    setup(d)
    with pytest.raises(KvpotError, match=needle):
        collect_sources([str(d)])


def test_binary_only_and_empty_inputs_are_refused(tmp_path):
    b = tmp_path / "x.bin"
    b.write_bytes(b"\x7fELF\x00\x00" * 50)
    with pytest.raises(KvpotError, match="every input is binary"):
        collect_sources([str(b)])
    e = tmp_path / "empty.txt"
    e.write_text("")
    with pytest.raises(KvpotError, match="the input is empty"):
        collect_sources([str(e)])
    with pytest.raises(KvpotError, match="does not exist"):
        collect_sources([str(tmp_path / "missing.txt")])


def test_stdin_is_checked_up_front_and_read_whole():
    with pytest.raises(KvpotError, match="stdin was empty"):
        collect_sources(["-"], stdin=io.BytesIO(b""))
    with pytest.raises(KvpotError, match="stdin looks binary"):
        collect_sources(["-"], stdin=io.BytesIO(b"\x00\x01" * 100))
    data = ("line of text " * 5000).encode()
    stream = io.BytesIO(data)
    src = collect_sources(["-"], stdin=stream)
    assert "".join(src.pieces(piece_bytes=1000, stdin=stream)) == data.decode()


_RSS_PROBE = r"""
import json, resource, sys
from kvpot.ingest import IncrementalTokenizer, collect_sources
from kvpot.runtime.llama import LlamaModel
lm = LlamaModel(sys.argv[1])
src = collect_sources([sys.argv[2]])
tok = IncrementalTokenizer(lm.tokenize)
n = sum(len(t) for t in tok.stream(src.pieces()))
print(json.dumps({"tokens": n, "bytes": src.bytes_read, "replaced": src.replaced,
                  "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def test_reader_memory_does_not_grow_with_file_size(tmp_path, smollm2_path):
    """5 MB and 50 MB through reader + tokenizer (no model compute): peak RSS stays flat."""
    runs = {}
    for mb in (5, 50):
        path = tmp_path / f"big{mb}.txt"
        bad = write_big_file(path, mb << 20, invalid_every=16)
        out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(smollm2_path), str(path)],
                             capture_output=True, text=True, timeout=1200)
        assert out.returncode == 0, out.stderr
        runs[mb] = json.loads(out.stdout.strip().splitlines()[-1])
        assert runs[mb]["bytes"] == path.stat().st_size
        assert runs[mb]["replaced"] == bad
        path.unlink()
    assert runs[50]["tokens"] > 9 * runs[5]["tokens"]
    # a whole-file read would add ~45 MB (bytes) and as much again for the decoded string; allow 25 MB of noise
    assert runs[50]["peak_rss_kb"] < runs[5]["peak_rss_kb"] + 25 * 1024, runs
