"""What a native build compiles for: the host CPU as the C compiler sees it with -march=native.

ggml compiles its CPU backend with -march=native unless told otherwise, so a wheel built on one
machine may use instructions another lacks ("Illegal instruction"). The wheel cache key takes
this target's fingerprint, so a KVPOT_HOME shared by two machines never installs a wheel built
for the other's CPU.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

# predefined macros that name an instruction-set feature, shown by the build and `kvpot doctor`
_ISA_MACRO = re.compile(
    r"^__(SSE\w*|SSSE3|AVX\w*|FMA|F16C|BMI2?|AMX_\w+|POPCNT|LZCNT|AES|PCLMUL|SHA|VAES|VPCLMULQDQ|GFNI"
    r"|ARM_NEON|ARM_FEATURE_\w+|riscv_\w+|VSX|ALTIVEC|POWER\d+_VECTOR|wasm_simd128)__$"
)
_FALSE = {"OFF", "0", "FALSE", "NO", "N"}


@dataclass(frozen=True)
class NativeTarget:
    native: bool  # does ggml build with -march=native (or -mcpu=native)?
    compiler: str  # the compiler that was asked, as cmake would find it
    flag: str  # the flag that made it answer for this host; "" when not native
    features: tuple[str, ...]  # ISA macros it defines there, e.g. ("__AVX2__", "__FMA__")
    fingerprint: str  # sha256 over the compiler's whole predefined-macro set for that flag

    def describe(self) -> str:
        if not self.native:
            return "portable (GGML_NATIVE off)"
        names = " ".join(f.strip("_") for f in self.features) or "no ISA extensions"
        return f"{self.compiler} {self.flag}: {names}"


def _native_requested(cmake_args: str) -> bool:
    """Mirror ggml's choice: GGML_NATIVE=OFF, a toolchain file or SOURCE_DATE_EPOCH turn it off."""
    native = "SOURCE_DATE_EPOCH" not in os.environ
    for arg in shlex.split(cmake_args):
        m = re.fullmatch(r"-DGGML_NATIVE(?::BOOL)?=(\S+)", arg)
        if m:
            native = m.group(1).upper() not in _FALSE
        if arg.startswith("-DCMAKE_TOOLCHAIN_FILE=") or arg.startswith("-DCMAKE_SYSTEM_NAME="):
            native = False
    return native


def _compiler() -> str:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(shlex.split(cand)[0]):
            return cand
    return ""


def _predefined(compiler: str, flag: str) -> str | None:
    cmd = [*shlex.split(compiler), *([flag] if flag else []), "-dM", "-E", "-x", "c", os.devnull]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def native_target(cmake_args: str) -> NativeTarget:
    compiler = _compiler()
    if not _native_requested(cmake_args) or not compiler:
        # without a compiler the build itself will say so; without -march=native the wheel is portable
        return NativeTarget(False, compiler, "", (), "portable")
    for flag in ("-march=native", "-mcpu=native", ""):
        out = _predefined(compiler, flag)
        if out is not None:
            break
    else:
        return NativeTarget(True, compiler, "", (), "unknown")
    macros = sorted(line.strip() for line in out.splitlines() if line.startswith("#define "))
    features = tuple(sorted({ln.split()[1] for ln in macros if _ISA_MACRO.match(ln.split()[1])}))
    fingerprint = hashlib.sha256("\n".join(macros).encode()).hexdigest()
    return NativeTarget(True, compiler, flag, features, fingerprint)
