"""CPU features of the build host, recorded in every build's stamp.

llama-server is built with `GGML_NATIVE=ON`: the compiler targets the CPU that runs the build
(`-march=native`), so the binary uses every instruction set that CPU has (AVX-512, AMX, ...)
and the CPU backend picks its matching kernels (repack, AMX). That is the fastest choice for a
cache that never leaves the machine, and the reason a binary can crash on one host and not on
another: the recorded features let a crash diagnosis name the instruction sets the binary was
built for (e.g. `amx_int8` on Sapphire Rapids, where the AMX path crashes) and the ones the
current host lacks (an `Illegal instruction` after copying a cache to an older CPU).

Two sources: the compiler's expansion of `-march=native` (what the binary may use) and the
`flags` line of /proc/cpuinfo (what the CPU has). Either may be missing (no compiler, not
Linux); the record then says so instead of guessing.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import TypedDict

CPUINFO = Path("/proc/cpuinfo")
# Instruction-set families worth naming in a one-line summary (cpuinfo spelling).
NOTABLE = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "sve",
    "sve2",
)
_MARCH = re.compile(r"-march=(?!native)([\w.-]+)")
# Predefined macros that name instruction sets (`__AVX2__`, `__AMX_INT8__`, `__ARM_FEATURE_SVE`).
_ISA_MACRO = re.compile(
    r"^#define __((?:SSE|SSSE|AVX|FMA|F16C|AMX|BMI|POPCNT|LZCNT|AES|PCLMUL|SHA|GFNI|VAES|"
    r"VPCLMULQDQ)\w*?)__ |^#define __(ARM_FEATURE_\w+) ",
    re.M,
)


class NativeOptions(TypedDict, total=False):
    """What `-march=native` means to the host's C compiler (empty when unknown)."""

    march: str | None
    isa: list[str]
    compiler: str


class CpuFeatures(TypedDict):
    """A host's CPU as a build's stamp records it (`cpu` in the stamp's JSON)."""

    machine: str
    model_name: str | None
    cpuinfo_flags: list[str]
    notable: list[str]
    march: str | None
    native_isa: list[str]


def cpuinfo_flags(text: str | None = None) -> list[str]:
    """The `flags` (x86) or `Features` (arm) of the first CPU in /proc/cpuinfo, sorted."""
    if text is None:
        try:
            text = CPUINFO.read_text(errors="replace")[:200_000]
        except OSError:
            return []
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return sorted(set(match.group(1).split())) if match else []


def cpu_model_name(text: str | None = None) -> str | None:
    if text is None:
        try:
            text = CPUINFO.read_text(errors="replace")[:200_000]
        except OSError:
            return None
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else None


def parse_native_options(driver_text: str, macros_text: str) -> NativeOptions:
    """`-march` from the compiler driver's `-###` output and the instruction-set macros from
    `-E -dM` (both with `-march=native`)."""
    march = _MARCH.search(driver_text)
    isa = {(a or b).lower() for a, b in _ISA_MACRO.findall(macros_text)}
    isa.discard("sse2_math")
    isa.discard("sse_math")
    return {"march": march.group(1) if march else None, "isa": sorted(isa)}


def native_compiler_options(compiler: str | None = None, timeout: float = 20.0) -> NativeOptions:
    """What `-march=native` means to this host's C compiler ({} when unknown)."""
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {}
    base = [compiler, "-march=native", "-x", "c"]
    try:
        driver = subprocess.run(
            [*base, "-###", "-c", "/dev/null", "-o", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        macros = subprocess.run(
            [*base, "-E", "-dM", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if macros.returncode != 0:
        return {}
    parsed = parse_native_options(driver.stderr + driver.stdout, macros.stdout)
    parsed["compiler"] = compiler
    return parsed


def host_cpu_features(
    cpuinfo_text: str | None = None, native: NativeOptions | None = None
) -> CpuFeatures:
    """The record stored in a build's stamp: machine, model, cpuinfo flags, -march=native."""
    flags = cpuinfo_flags(cpuinfo_text)
    native = native_compiler_options() if native is None else native
    return {
        "machine": platform.machine(),
        "model_name": cpu_model_name(cpuinfo_text),
        "cpuinfo_flags": flags,
        "notable": [name for name in NOTABLE if name in flags],
        "march": native.get("march"),
        "native_isa": native.get("isa", []),
    }


def summarize(features: CpuFeatures | None) -> str:
    """One line: `-march=znver3: avx avx2 fma ...` (or why there is nothing to say)."""
    if not features:
        return "not recorded (built before triage recorded CPU features)"
    march = features.get("march") or "?"
    notable = " ".join(features.get("notable") or []) or "no notable SIMD flags"
    return f"-march={march}: {notable}"


def missing_on_host(built_for: CpuFeatures | None, host: CpuFeatures | None = None) -> list[str]:
    """cpuinfo flags the build host had that this host lacks (only notable ones: those are
    the instruction sets the CPU backend dispatches on). Empty when either side is unknown."""
    if not built_for or not built_for.get("cpuinfo_flags"):
        return []
    host = host or host_cpu_features(native={})
    have = set(host.get("cpuinfo_flags") or [])
    if not have:
        return []
    return [name for name in built_for.get("notable") or [] if name not in have]
