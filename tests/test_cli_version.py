"""`kvpot --version` and `-h` work as in llama.cpp's tools: exit 0, on stdout."""

from __future__ import annotations

from importlib import metadata

import pytest
from conftest import run_cli

import kvpot
from kvpot.build.pins import LLAMA_CPP_COMMIT


def test_version_names_kvpot_the_runtime_and_the_llama_cpp_commit():
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert "\n" not in line
    assert line.startswith(f"kvpot {kvpot.__version__} ")
    assert metadata.version("llama_cpp_python") in line
    assert LLAMA_CPP_COMMIT in line


@pytest.mark.parametrize("args", [("-h",), ("ask", "-h"), ("bench", "niah", "-h"), ("train", "locret", "-h")])
def test_short_help_is_the_long_help(args):
    short, long = run_cli(*args), run_cli(*args[:-1], "--help")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout and "Usage:" in short.stdout
