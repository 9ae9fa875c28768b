"""The CPU the runtime was compiled for beside the CPU it runs on, and what became of AMX.

ggml reports its CPU backend's compile-time features (kvpot_cpu_features); the host's come from
/proc/cpuinfo. A feature compiled in but missing on the host means the wheel was built for another
machine and will die with "Illegal instruction" on the first kernel that uses it.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from kvpot.runtime import library

# ggml feature name -> the /proc/cpuinfo flag that says the host has it (x86 "flags", ARM "Features")
_HOST_FLAG = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "AVX_VNNI": "avx_vnni", "F16C": "f16c",
    "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8",
    "NEON": "asimd", "ARM_FMA": "asimd", "FP16_VA": "asimdhp", "DOTPROD": "asimddp", "MATMUL_INT8": "i8mm",
    "SVE": "sve", "SME": "sme",
}

AMX_WHY = ("kvpot builds ggml's CPU backend without its AMX matmul path: it segfaults in "
           "ggml_backend_amx_mul_mat on some Sapphire Rapids machines (llama.cpp issue 20824); "
           "CMAKE_ARGS=-DKVPOT_CPU_AMX=ON builds it anyway (unsafe)")


def parse_features(raw: str) -> dict[str, str]:
    """'SSE3=1,AVX2=1,REPACK=1' -> {'SSE3': '1', ...}"""
    out = {}
    for part in raw.split(","):
        name, _, value = part.partition("=")
        if name.strip():
            out[name.strip()] = value.strip()
    return out


def describe_host() -> str:
    """What a figure was measured on: the CPU's name and the SIMD features ggml picks kernels by (a bench
    run in parts may span machines, and the same name comes with other features)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:  # not Linux
        lines = []
    name = next((line.partition(":")[2].strip() for line in lines if line.lower().startswith(("model name", "hardware"))),
                platform.processor() or platform.machine() or "unknown CPU")
    flags = host_flags() or frozenset()
    simd = (f for f, flag in _HOST_FLAG.items() if flag in flags and f.startswith(("AVX", "F16C", "FMA", "NEON", "SVE", "AMX")))
    return f"{name} ({', '.join(simd)})"


def host_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The host CPU's feature flags, or None where they cannot be read (not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return None


@dataclass(frozen=True)
class CpuReport:
    built_for: tuple[str, ...]  # ggml features compiled in (value "1")
    host: tuple[str, ...] | None  # of the features ggml knows, the ones this CPU has; None if unknown
    missing_here: tuple[str, ...]  # compiled in, absent on this CPU: "Illegal instruction" ahead
    unused_here: tuple[str, ...]  # on this CPU, not compiled in (built elsewhere or portable): slower
    amx_built: bool  # the runtime holds ggml's AMX path
    amx_buffer: bool  # the CPU device offers the AMX weight buffer type
    extra_bufts: tuple[str, ...]


def compare(features: dict[str, str], extra_bufts: list[str], flags: frozenset[str] | None) -> CpuReport:
    built = tuple(n for n, v in features.items() if v == "1" and n in _HOST_FLAG)
    if flags is None:
        host, missing, unused = None, (), ()
    else:
        host = tuple(n for n in _HOST_FLAG if _HOST_FLAG[n] in flags and _arch_of(n) == _arch_of_flags(flags))
        missing = tuple(n for n in built if _HOST_FLAG[n] not in flags)
        # AMX is left out on purpose; it is not a missed feature
        unused = tuple(n for n in host if n not in built and n != "AMX_INT8")
    return CpuReport(
        built_for=built, host=host, missing_here=missing, unused_here=unused,
        amx_built=features.get("AMX_INT8") == "1", amx_buffer="AMX" in extra_bufts,
        extra_bufts=tuple(extra_bufts),
    )


_ARM = {"NEON", "ARM_FMA", "FP16_VA", "DOTPROD", "MATMUL_INT8", "SVE", "SME"}


def _arch_of(name: str) -> str:
    return "arm" if name in _ARM else "x86"


def _arch_of_flags(flags: frozenset[str]) -> str:
    # every x86-64 CPU lists sse2; ARM cpuinfo never does
    return "x86" if "sse2" in flags else "arm"


def report() -> CpuReport:
    """The loaded runtime's CPU facts beside this machine's."""
    lib = library.load()
    features = parse_features(lib.kvpot_cpu_features().decode())
    bufts = [b for b in lib.kvpot_cpu_extra_bufts().decode().split(",") if b]
    return compare(features, bufts, host_flags() if platform.system() == "Linux" else None)
