"""The runtime build: pinned source, patches, cache key, refusal of a corrupted sdist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from kvpot import paths
from kvpot.build import runtime
from kvpot.build.cache_key import cache_key
from kvpot.build.patching import apply_series, read_series
from kvpot.build.pins import SDIST_FILE, VENDOR_DIR
from kvpot.build.sdist import extract_pristine, fetch_sdist, verify_sdist
from kvpot.errors import BuildError


def _touched_files(patch: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.M)


@pytest.fixture(scope="module")
def pristine_vendor() -> Path:
    sdist = fetch_sdist(paths.build_dir() / "sdist")
    return extract_pristine(sdist, paths.build_dir()) / VENDOR_DIR


def _copy_touched(pristine_vendor: Path, patches: list[Path], dest: Path) -> None:
    for p in patches:
        for rel in _touched_files(p):
            src = pristine_vendor / rel
            if src.exists():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)


def test_patches_apply_to_pinned_source(pristine_vendor, tmp_path):
    patches = read_series(REPO / "patches")
    assert patches, "patches/series lists no patch"
    _copy_touched(pristine_vendor, patches, tmp_path)
    before = {rel: (tmp_path / rel).read_bytes() for p in patches for rel in _touched_files(p) if (tmp_path / rel).exists()}
    applied = apply_series(REPO / "patches", tmp_path)
    assert applied == [p.name for p in patches]
    for rel, old in before.items():
        assert (tmp_path / rel).read_bytes() != old, f"{rel} unchanged by the series"
    assert "ggml_ext/ggml_ext.cmake" in (tmp_path / "src" / "CMakeLists.txt").read_text()


def test_patch_that_does_not_apply_is_named(pristine_vendor, tmp_path):
    pdir = tmp_path / "patches"
    pdir.mkdir()
    bad = pdir / "0009-bad-context.patch"
    bad.write_text("--- a/src/CMakeLists.txt\n+++ b/src/CMakeLists.txt\n@@ -1,3 +1,4 @@\n no such line\n"
                   " nor this one\n+added\n and this\n")
    (pdir / "series").write_text("0009-bad-context.patch\n")
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    shutil.copy2(pristine_vendor / "src" / "CMakeLists.txt", tree / "src" / "CMakeLists.txt")
    original = (tree / "src" / "CMakeLists.txt").read_bytes()
    with pytest.raises(BuildError, match="0009-bad-context.patch"):
        apply_series(pdir, tree)
    assert (tree / "src" / "CMakeLists.txt").read_bytes() == original  # dry run first: nothing half-applied


def test_series_naming_a_missing_patch_is_refused(tmp_path):
    (tmp_path / "series").write_text("# comment\n\n0001-gone.patch\n")
    with pytest.raises(BuildError, match="0001-gone.patch"):
        read_series(tmp_path)


@pytest.fixture()
def sources(tmp_path):
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    shutil.copytree(REPO / "ggml_ext", tmp_path / "ggml_ext")
    return tmp_path / "patches", tmp_path / "ggml_ext"


def test_cache_key_follows_patches_ext_and_cmake_args(sources):
    pdir, edir = sources
    base = cache_key(pdir, edir, "-DLLAVA_BUILD=OFF")
    assert cache_key(pdir, edir, "  -DLLAVA_BUILD=OFF ") == base  # whitespace is not a change
    assert cache_key(pdir, edir, "-DGGML_CUDA=ON -DLLAVA_BUILD=OFF") != base

    first_patch = read_series(pdir)[0]
    first_patch.write_text(first_patch.read_text() + "\n")
    after_patch = cache_key(pdir, edir, "-DLLAVA_BUILD=OFF")
    assert after_patch != base

    src = next(edir.glob("*.cpp"))
    src.write_text(src.read_text() + "// changed\n")
    after_ext = cache_key(pdir, edir, "-DLLAVA_BUILD=OFF")
    assert after_ext not in (base, after_patch)

    (edir / "new-file.cpp").write_text("// new\n")
    assert cache_key(pdir, edir, "-DLLAVA_BUILD=OFF") != after_ext


def test_corrupted_sdist_is_refused_and_removed(tmp_path):
    bad = tmp_path / SDIST_FILE
    bad.write_bytes(b"not the sdist")
    with pytest.raises(BuildError, match="does not match the pinned"):
        verify_sdist(bad)
    assert not bad.exists()


def test_cached_corrupted_sdist_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "sdist"
    cache.mkdir()
    (cache / SDIST_FILE).write_bytes(b"\x1f\x8b truncated")
    monkeypatch.delenv("KVPOT_SDIST", raising=False)
    with pytest.raises(BuildError, match="sha256"):
        fetch_sdist(cache)
    assert not (cache / SDIST_FILE).exists()


def test_explicit_sdist_with_wrong_hash_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "llama.tar.gz"
    bad.write_bytes(b"x" * 100)
    monkeypatch.setenv("KVPOT_SDIST", str(bad))
    with pytest.raises(BuildError, match="KVPOT_SDIST"):
        fetch_sdist(tmp_path / "cache")


def test_installed_runtime_is_this_checkout_and_cached():
    """The installed wheel was built from these very patches/ggml_ext; a rebuild is served from the cache."""
    res = runtime.build_runtime(install=False, say=lambda msg: None)
    assert res.cached, "the wheel for this checkout is not in the cache"
    assert runtime.installed_version() == res.version
    assert res.wheel.name.startswith(f"llama_cpp_python-{res.version}-")
