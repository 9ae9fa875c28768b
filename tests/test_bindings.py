"""The kvpot_* C API is present in the libllama that llama_cpp loaded, and a stock one is refused."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

import kvpot
from kvpot.build.pins import LLAMA_CPP_COMMIT
from kvpot.errors import RuntimeMissing
from kvpot.runtime import library


def test_version_and_abi_match_python_side():
    info = library.info()
    assert info.kvpot_version == kvpot.__version__
    assert info.abi == kvpot.ABI_VERSION
    assert info.llama_commit == LLAMA_CPP_COMMIT
    assert "CPU" in info.backends


def test_same_library_object_as_llama_cpp():
    import llama_cpp.llama_cpp as raw

    assert library.load() is raw._lib


def test_abi_header_matches_python_constant():
    header = (Path(__file__).resolve().parent.parent / "ggml_ext" / "kvpot.h").read_text()
    assert f"#define KVPOT_ABI_VERSION {kvpot.ABI_VERSION}\n" in header


def test_stock_library_is_refused():
    """libggml-base from the same wheel is a genuine llama.cpp library without the kvpot API."""
    lib_dir = Path(library.load()._name).parent
    stock = next(lib_dir.glob("libggml-base.*"))
    with pytest.raises(RuntimeMissing, match=r"stock llama\.cpp without the kvpot API; build the patched runtime with `make runtime`"):
        library.check_library(ctypes.CDLL(str(stock)))


def test_other_abi_is_refused(monkeypatch):
    monkeypatch.setattr(library, "ABI_VERSION", kvpot.ABI_VERSION + 1)
    with pytest.raises(RuntimeMissing, match=f"ABI {kvpot.ABI_VERSION} but this kvpot needs ABI {kvpot.ABI_VERSION + 1}"):
        library.check_library(library.load())


def test_a_build_older_than_the_package_is_refused_by_name(monkeypatch):
    """Functions are added without a new ABI number (saved contexts stay readable), so a library from
    before one was added passes the ABI check and must be refused by what it lacks."""
    from kvpot.runtime import api

    monkeypatch.setattr(api, "SIGNATURES", [*api.SIGNATURES, ("kvpot_added_later", ctypes.c_int32, [])])
    with pytest.raises(RuntimeMissing, match=r"older than this package \(no kvpot_added_later\); rebuild"):
        library.check_library(library.load())
