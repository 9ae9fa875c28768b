"""The line that opens a read names what is read as the user gave it: a file, stdin, several."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.reading import _describe
from kvpot.ingest.sources import Source, SourceSet


@pytest.mark.parametrize("sources, want", [
    ([Source("notes.txt", Path("notes.txt"), 3 * 2**20)], "notes.txt, 3.0 MiB"),
    ([Source("-", None, None, head=b"x" * 3072, complete=True)], "stdin, 3.0 KiB"),  # read ahead to its end
    ([Source("-", None, None, head=b"x" * 3072)], "stdin, size unknown (a stream)"),
    ([Source("a", Path("a"), 10), Source("b", Path("b"), 20), Source("-", None, None, head=b"xy", complete=True)],
     "2 files and stdin, 32 bytes"),
    ([Source("a", Path("a"), 10), Source("/dev/fd/3", Path("/dev/fd/3"), None, head=b"x")],
     "1 file and /dev/fd/3, size unknown (a stream)"),
])
def test_the_reading_line_names_the_inputs(sources, want):
    assert _describe(SourceSet(sources)) == want
