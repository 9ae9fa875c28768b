"""Document formats are a registry: a format is one module holding a `Format`, and one line in
kvpot.ingest.formats.registry makes kvpot read it. A toy format (text rot13-encoded under a first line
"ROT13") is written here as a module of its own, registered by extending the registry's list, and read
from a folder, from stdin and inside a gzip file with its own locations. Every registered format
claims its own sample and no other's, and the code that detects and reads files names no format."""

from __future__ import annotations

import ast
import codecs
import gzip
import importlib.util
import io
import zipfile
from pathlib import Path

import pytest
from docmaker import write_docx, write_epub, write_odt, write_pdf

import kvpot.ingest.formats as formats_pkg
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources, sources, tree
from kvpot.ingest.formats import detect, identify, registry

TOY = '''"""ROT13: text rot13-encoded under a first line "ROT13", read a line at a time."""

import codecs

from kvpot.ingest.formats.base import Format, UnreadableInput

MAGIC = b"ROT13\\n"


def _body(data: bytes) -> list[str]:
    return data[len(MAGIC):].decode("utf-8").splitlines(keepends=True)


def check(path, name):
    with open(path, "rb") as f:
        if not "".join(_body(f.read())).strip():
            raise UnreadableInput(f"{name} is a ROT13 file with no text")


def pieces(doc):
    with doc.open() as f:
        body = _body(f.read())
    for n, line in enumerate(body, 2):
        yield codecs.decode(line, "rot13"), f"verse {n}"


FORMAT = Format("rot13", "ROT13", pieces, magic=(MAGIC,), check=check, streams=True)
'''

LINES = ["The lighthouse keeper logs the storm at dawn.\n", "Code word: amber falcon.\n",
         "The supply boat is late by two days.\n"]


def _rot13(lines: list[str]) -> bytes:
    return b"ROT13\n" + codecs.encode("".join(lines), "rot13").encode()


@pytest.fixture
def toy(tmp_path_factory, monkeypatch):
    """The toy format's module, written to a file and imported; registered by its one line."""
    path = tmp_path_factory.mktemp("toy") / "rot13.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("kvpot_toy_rot13", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(registry, "FORMATS", (*registry.FORMATS, module.FORMAT))  # the registry line
    return module


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "log.rot13").write_bytes(_rot13(LINES))
    (folder / "readme.txt").write_text("Plain notes.\n")
    return folder


def test_a_registered_toy_format_is_read_from_a_folder_with_its_locations(tmp_path, toy):
    folder = _folder(tmp_path)
    got = collect_sources([str(folder)])
    kinds = {Path(s.name).name: s.kind.kind for s in got.sources}
    assert kinds == {"log.rot13": "rot13", "readme.txt": "text"}
    text = "".join(got.pieces())
    for n, line in enumerate(LINES, 2):
        at = text.index(line)
        mark = got.where(at)
        assert (Path(mark.source).name, mark.where) == ("log.rot13", f"verse {n}")
    assert got.where(text.index("Plain notes.")).where == "line 1"


def test_without_its_registry_line_the_toy_file_is_plain_text(tmp_path):
    folder = _folder(tmp_path)
    got = collect_sources([str(folder)])
    assert {s.kind.kind for s in got.sources} == {"text"}
    text = "".join(got.pieces())
    assert _rot13(LINES).decode() in text and LINES[1] not in text


def test_the_toy_format_streams_from_stdin_and_inside_gzip(tmp_path, toy):
    got = collect_sources(["-"], stdin=io.BytesIO(_rot13(LINES)))
    assert got.sources[0].kind.kind == "rot13"
    assert "".join(got.pieces(stdin=io.BytesIO())) == "".join(LINES)
    packed = tmp_path / "log.gz"
    packed.write_bytes(gzip.compress(_rot13(LINES)))
    got = collect_sources([str(packed)])
    assert (got.sources[0].kind.kind, got.sources[0].kind.codec) == ("rot13", "gzip")
    assert "".join(got.pieces()) == "".join(LINES)


def test_the_toy_formats_check_refuses_a_bad_file_in_one_line(tmp_path, toy):
    empty = tmp_path / "empty.rot13"
    empty.write_bytes(b"ROT13\n\n")
    with pytest.raises(KvpotError) as e:
        collect_sources([str(empty)])
    assert str(e.value) == f"{empty} is a ROT13 file with no text"


def _samples(tmp_path: Path) -> dict[str, Path]:
    """A small file of each registered format (and the toy), and plain text, built here."""
    paras = [(1, "Keeper's log"), (0, "The storm came at dawn.")]
    html = tmp_path / "page.html"
    html.write_text("<!doctype html><html><body><p>The storm came at dawn.</p></body></html>")
    toy = tmp_path / "log.rot13"
    toy.write_bytes(_rot13(LINES))
    text = tmp_path / "notes.txt"
    text.write_text("".join(LINES))
    return {
        "pdf": write_pdf(tmp_path / "log.pdf", [["The storm came at dawn."]]),
        "epub": write_epub(tmp_path / "log.epub", "Log", [("Dawn", ["The storm came at dawn."])]),
        "docx": write_docx(tmp_path / "log.docx", paras),
        "odt": write_odt(tmp_path / "log.odt", paras),
        "html": html,
        "rot13": toy,
        "text": text,
    }


def _recognised_by(path: Path) -> list[str]:
    """The registered formats whose detection recognises the file: by its first bytes, or for a zip,
    by its members."""
    head = path.read_bytes()[:8192]
    by = [f for f in registry.FORMATS if f.claimed(head)]
    if detect.is_zip(head):
        by.append(detect.zip_format(path, path.name))
    return [f.name for f in by]


def test_every_format_recognises_its_own_sample_and_no_others(tmp_path, toy):
    samples = _samples(tmp_path)
    missing = [f.name for f in registry.FORMATS if f.name not in samples]
    assert not missing, f"no sample built for {missing}: add one to _samples"
    for name, path in samples.items():
        assert _recognised_by(path) == ([] if name == "text" else [name]), path
        assert identify(path, path.read_bytes()[:8192], path.name).kind == name


def test_a_zip_no_format_claims_is_refused_naming_the_zip_formats(tmp_path):
    path = tmp_path / "photos.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.jpg", b"\xff\xd8")
    with pytest.raises(KvpotError) as e:
        identify(path, path.read_bytes()[:8192], path.name)
    titles = [f.title for f in registry.FORMATS if f.in_zip]
    assert titles and all(t in str(e.value) for t in titles)


def _string_constants(module) -> set[str]:
    """The string constants of a module's code, its docstrings left out."""
    module_ast = ast.parse(Path(module.__file__).read_text())
    docs = {id(node.body[0].value) for node in ast.walk(module_ast)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(module_ast)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs}


@pytest.mark.parametrize("module", [formats_pkg, detect, sources, tree], ids=lambda m: m.__name__)
def test_detection_and_reading_name_no_format(module):
    """A format is added without editing these: they walk the registry and test no format's name."""
    names = {f.name for f in registry.FORMATS}
    assert names, "the registry lists no format"
    assert not names & _string_constants(module)
