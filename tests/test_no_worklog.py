"""Code, comments and docs say what is true now; history lives in git and in issue notes. A line that
dates a fact by a numbered work session or a branch name, anywhere in the tracked tree, fails this test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# a work session named by number or as the current one, or a branch named after an issue
_SESSION, _BRANCH = "session", "branch"
WORKLOG = re.compile(rf"\b{_SESSION}s? [0-9]+|\bthis {_SESSION}\b|\bissue-[0-9]+ {_BRANCH}\b", re.IGNORECASE)


def test_no_work_log_notes_in_the_tree():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    found = []
    for name in filter(None, files):
        path = REPO / name.decode()
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (shipped adapters)
        for n, line in enumerate(text.splitlines(), 1):
            if WORKLOG.search(line):
                found.append(f"{name.decode()}:{n}: {line.strip()[:100]}")
    assert not found, "work-log notes (say what is true now instead):\n" + "\n".join(found)
