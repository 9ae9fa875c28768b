"""Find the libllama that llama_cpp loaded and check that it is kvpot's patched build."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from kvpot.errors import RuntimeMissing
from kvpot.runtime import api
from kvpot.version import ABI_VERSION

HOW_TO_BUILD = "build the patched runtime with `make runtime` (or `kvpot build`) from a kvpot checkout"


@dataclass(frozen=True)
class RuntimeInfo:
    kvpot_version: str
    abi: int
    llama_commit: str
    backends: tuple[str, ...]
    library_path: str
    llama_cpp_version: str


def check_library(lib: ctypes.CDLL) -> None:
    """Refuse a libllama without the kvpot_* API or with another ABI number."""
    name = getattr(lib, "_name", "libllama")
    if not hasattr(lib, "kvpot_abi_version"):
        raise RuntimeMissing(f"{name} is a stock llama.cpp without the kvpot API; {HOW_TO_BUILD}")
    # functions are added without a new ABI number (saved contexts stay readable): a build from before
    # one was added lacks it
    missing = [fn for fn, _, _ in api.SIGNATURES if not hasattr(lib, fn)]
    if missing:
        raise RuntimeMissing(f"{name} is a kvpot build older than this package (no {', '.join(missing)}); "
                             f"rebuild: {HOW_TO_BUILD}")
    api.declare(lib)
    abi = lib.kvpot_abi_version()
    if abi != ABI_VERSION:
        raise RuntimeMissing(
            f"libllama speaks kvpot ABI {abi} but this kvpot needs ABI {ABI_VERSION}; rebuild: {HOW_TO_BUILD}"
        )


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    """The checked libllama (the very object llama_cpp uses), loaded once."""
    try:
        import llama_cpp.llama_cpp as llama_cpp_raw
    except ImportError:
        raise RuntimeMissing(f"llama_cpp is not installed; {HOW_TO_BUILD}") from None
    except (OSError, RuntimeError, AttributeError) as e:
        raise RuntimeMissing(f"llama_cpp could not load its libllama ({e}); {HOW_TO_BUILD}") from None
    lib = llama_cpp_raw._lib
    check_library(lib)
    _install_crash_banner(lib)
    return lib


def crash_banner(lib: ctypes.CDLL) -> str:
    import llama_cpp

    return (f"\nkvpot {lib.kvpot_version().decode()} crashed in native code (runtime llama-cpp-python "
            f"{llama_cpp.__version__}, llama.cpp {lib.kvpot_llama_commit().decode()}, {lib._name}).\n"
            "Please report it with the lines below and the output of `kvpot doctor`.\n")


def _install_crash_banner(lib: ctypes.CDLL) -> None:
    # only where the process asked for crash reports (the CLI, pytest): the banner chains to
    # faulthandler, which then prints the Python stack of the step that died
    import faulthandler

    if faulthandler.is_enabled():
        lib.kvpot_crash_banner_install(crash_banner(lib).encode())


def info() -> RuntimeInfo:
    import llama_cpp

    lib = load()
    return RuntimeInfo(
        kvpot_version=lib.kvpot_version().decode(),
        abi=lib.kvpot_abi_version(),
        llama_commit=lib.kvpot_llama_commit().decode(),
        backends=tuple(b for b in lib.kvpot_backends().decode().split(",") if b),
        library_path=str(lib._name),
        llama_cpp_version=llama_cpp.__version__,
    )
