"""Folder inputs: .gitignore honoured, vendored folders and binaries left out, several --glob and
--exclude patterns, and one summary line (the full list only with verbose)."""

from __future__ import annotations

import subprocess

from kvpot.ingest import collect_sources


def _tree(root):
    files = {
        ".gitignore": "*.log\nsecret/\n!keep.log\n",
        "src/app.py": "print('app')\n", "src/util.py": "x = 1\n", "src/notes.txt": "notes\n",
        "src/.gitignore": "generated_*.py\n", "src/generated_a.py": "g = 1\n",
        "run.log": "log\n", "keep.log": "kept log\n", "secret/key.txt": "hidden\n",
        "node_modules/lib/index.js": "js\n", "build/out.txt": "built\n", "tests/test_app.py": "t = 1\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "src/__pycache__").mkdir()
    (root / "src/__pycache__/app.cpython-311.pyc").write_bytes(b"\x00\x01pyc" * 20)
    (root / "src/blob.py").write_bytes(b"\x00" * 64)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _names(src, root):
    return sorted(str(__import__("pathlib").Path(s.name).relative_to(root)) for s in src.sources)


def test_gitignore_vendored_and_binaries_are_left_out(tmp_path):
    root = _tree(tmp_path / "repo")
    seen = []
    src = collect_sources([str(root)], notice=seen.append)
    assert _names(src, root) == ["keep.log", "src/app.py", "src/notes.txt", "src/util.py", "tests/test_app.py"]
    why = dict(src.left_out)
    assert why[str(root / "run.log")] == "ignored by .gitignore"
    assert why[str(root / "secret") + "/"] == "ignored by .gitignore"
    assert why[str(root / "src/generated_a.py")] == "ignored by .gitignore"  # the nested .gitignore
    assert why[str(root / "node_modules") + "/"] == "in vendored or generated folders"
    assert why[str(root / "src/blob.py")] == "binary"
    assert len(seen) == 1, seen  # one summary line, however many were left out
    assert seen[0].startswith("reading 5 files; left out") and "-v lists them" in seen[0]


def test_a_subfolder_honours_the_repository_gitignore(tmp_path):
    root = _tree(tmp_path / "repo")
    (root / "src/debug.log").write_text("x\n")
    src = collect_sources([str(root / "src")])
    assert str(root / "src/debug.log") not in [s.name for s in src.sources]


def test_several_globs_and_excludes(tmp_path):
    root = _tree(tmp_path / "repo")
    src = collect_sources([str(root)], glob=["*.py", "*.txt"], exclude=["tests/", "util.py"])
    assert _names(src, root) == ["src/app.py", "src/notes.txt"]
    why = dict(src.left_out)
    assert why[str(root / "tests") + "/"] == "excluded by --exclude"
    assert why[str(root / "keep.log")] == "not matching --glob"


def test_verbose_lists_each_left_out_with_its_reason(tmp_path):
    root = _tree(tmp_path / "repo")
    seen = []
    src = collect_sources([str(root)], notice=seen.append, verbose=True)
    assert len(seen) == 1 + len(src.left_out)
    assert f"  left out {root / 'run.log'}: ignored by .gitignore" in seen


def test_cli_takes_several_globs_and_excludes(tmp_path):
    from conftest import run_cli

    root = _tree(tmp_path / "repo")
    # nothing matches: refused before any model loads, naming every pattern given
    res = run_cli("ask", str(root), "q?", "--glob", "*.nomatch", "--glob", "*.alsono", "--exclude", "src/")
    assert res.returncode == 1
    assert "'*.nomatch' or '*.alsono'" in res.stderr and "excluded by --exclude" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
