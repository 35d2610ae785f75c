"""Where FlyDSL finds its linker, and the environment of a compile-only FlyDSL build.

FlyDSL links gfx9 code objects with ``$ROCM_PATH/llvm/bin/ld.lld``. A machine without ROCm
(CI, a laptop) can still compile for gfx950 with any LLVM ``ld.lld`` (Debian's ``lld-19``)
laid out under a private root, which is what ``rocm_root`` builds.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ARCHES = ("gfx950", "gfx942")
_LLD_NAMES = ("ld.lld-19", "ld.lld")


class ToolchainMissing(RuntimeError):
    """No ld.lld to link a FlyDSL code object with (install lld-19 or ROCm)."""


def find_lld() -> Path | None:
    """An ld.lld able to link AMDGPU code objects: ROCm's own, else one on PATH."""
    rocm = os.environ.get("ROCM_PATH")
    if rocm and (Path(rocm) / "llvm" / "bin" / "ld.lld").is_file():
        return Path(rocm) / "llvm" / "bin" / "ld.lld"
    for name in _LLD_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def rocm_root(where: Path) -> Path:
    """A ROCm-shaped root for FlyDSL's linker lookup: ``where/llvm/bin/ld.lld``.

    Returns ROCM_PATH itself when it already holds an ld.lld.
    """
    lld = find_lld()
    if lld is None:
        raise ToolchainMissing(
            "FlyDSL needs ld.lld to link gfx9 code objects: none at $ROCM_PATH/llvm/bin/ld.lld "
            f"nor {' / '.join(_LLD_NAMES)} on PATH (apt-get install lld-19)"
        )
    rocm = os.environ.get("ROCM_PATH")
    if rocm and lld == Path(rocm) / "llvm" / "bin" / "ld.lld":
        return Path(rocm)
    bin_dir = where / "llvm" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "ld.lld"
    if not link.exists():
        link.symlink_to(lld)
    return where


def compile_env(arch: str, rocm: Path, dump_dir: Path, cache_dir: Path) -> dict[str, str]:
    """The environment of a compile-only FlyDSL process that writes each kernel's final ISA
    to ``dump_dir/<kernel name>/*final_isa.s`` and touches nothing outside the given dirs."""
    if arch not in ARCHES:
        raise ValueError(f"FlyDSL target {arch!r}: mono builds only {', '.join(ARCHES)}")
    env = dict(os.environ)
    env.update(
        ROCM_PATH=str(rocm),
        FLYDSL_GPU_ARCH=arch,
        COMPILE_ONLY="1",
        FLYDSL_DEBUG_DUMP_ASM="1",
        FLYDSL_DUMP_DIR=str(dump_dir),
        FLYDSL_RUNTIME_CACHE_DIR=str(cache_dir),
        FLYDSL_RUNTIME_ENABLE_CACHE="0",
    )
    env.pop("FLYDSL_DUMP_IR", None)
    return env
