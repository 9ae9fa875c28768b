"""The README as a newcomer reads it: short, every link to a page that exists, a quick start that asks about a
file kvpot writes itself, and the test command CI runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import run_cli

from kvpot.bench.logbook import logbook
from kvpot.cli.run import DEMO_ENTRIES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) outside code: a target with a scheme (https:, mailto:) or only an anchor is not a file
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text with fenced code blocks and inline code taken out (a `[x](y)` there is not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def local_links(page: Path) -> list[str]:
    targets = LINK.findall(prose(page.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def section(text: str, title: str) -> str:
    """The body of the `## title` section."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert found, f"README has no section {title!r}"
    return found.group(1)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines"


def test_the_link_reader_finds_links_and_skips_code():
    text = "see [a](docs/a.md) and [b](https://x.org) `[c](c.md)`\n```sh\n[d](d.md)\n```\n[e](e.md#part) [f](#top)\n"
    targets = LINK.findall(prose(text))
    assert targets == ["docs/a.md", "https://x.org", "e.md#part", "#top"]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_local_link_resolves(page):
    missing = [t for t in local_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_readme_links_every_user_page():
    """A docs page no one links to is a page no one finds: every docs/*.md is reached from the README."""
    linked = {(README.parent / t.split("#")[0]).resolve() for t in local_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, unlinked


def test_readme_names_the_test_command_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert re.search(r"^make test\b.*CI", section(README.read_text(), "Tests"), flags=re.M)


def test_quick_start_asks_about_the_file_the_demo_writes(tmp_path):
    """The quick start's `kvpot ask` names the logbook `kvpot demo` (make demo) writes, and asks the demo's
    question. The demo is run here with a model it cannot pull: it writes the logbook, then stops at the pull."""
    quick = section(README.read_text(), "Quick start")
    assert "make demo" in quick
    ask = next(line for line in quick.splitlines() if line.startswith("kvpot ask "))
    _, _, path, question = shlex.split(ask)
    default_home = "~/.cache/kvpot/"
    assert path.startswith(default_home), path
    res = run_cli("demo", "-m", "no-such-model", env={"KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 1 and "unknown model" in res.stderr, res.stderr
    written = tmp_path / path[len(default_home):]
    assert written.is_file(), f"kvpot demo did not write {written}"
    _, demo_question, answer = logbook(n_entries=DEMO_ENTRIES)
    assert question == demo_question
    assert answer in written.read_text()
