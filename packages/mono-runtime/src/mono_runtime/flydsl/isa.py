"""Reading a gfx9 kernel's final ISA (``*final_isa.s``): its instructions, its resources
(registers, LDS, scratch, spills from the code object metadata) and its kernel arguments.

Tests assert on what the hardware will execute (cache bits of mailbox accesses, sleeps in
polls, clock reads), and the residency check reads the resources, so both come from the
text the assembler turned into the code object, not from an IR before register allocation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_META = re.compile(r"\.amdgpu_metadata\n(.*?)\n\s*\.end_amdgpu_metadata", re.S)
_SCALAR = re.compile(r"^ {4}\.([a-z_]+):\s+(\S+)\s*$")
_ARG = re.compile(r"^ {6}- \.offset:\s+(\d+)\s*$")
_ARG_FIELD = re.compile(r"^ {8}\.([a-z_]+):\s+(\S+)\s*$")


@dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str


@dataclass(frozen=True)
class Resources:
    """Per-wave registers and per-workgroup memory of one kernel, as its code object says."""

    vgprs: int  # architectural VGPRs
    agprs: int  # accumulation VGPRs
    total_vgprs: int  # unified VGPR file use (gfx90a+: VGPRs, aligned, then AGPRs)
    sgprs: int
    lds_bytes: int  # static group segment
    scratch_bytes: int  # private segment per lane; non-zero means spills or stack
    vgpr_spills: int
    sgpr_spills: int
    max_threads: int
    wave_size: int

    @property
    def spills(self) -> bool:
        """Spills to memory (scratch). SGPR spills go to VGPR lanes first, which cost
        VGPRs (counted above) but no memory; only once those run out do they use scratch,
        which then shows in ``scratch_bytes``."""
        return bool(self.vgpr_spills or self.scratch_bytes)


@dataclass(frozen=True)
class KernelIsa:
    name: str
    arch: str
    text: str  # the whole assembly file
    body: tuple[str, ...]  # instruction lines of the kernel, labels kept, comments dropped
    resources: Resources
    args: tuple[KernelArg, ...]

    def count(self, pattern: str) -> int:
        """Instruction lines matching the regular expression ``pattern``."""
        rx = re.compile(pattern)
        return sum(1 for line in self.body if rx.search(line))

    def lines(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [line for line in self.body if rx.search(line)]


def _body(text: str, name: str) -> tuple[str, ...]:
    start = re.search(rf"^{re.escape(name)}:\s*$", text, re.M)
    end = re.search(r"^\.Lfunc_end\d+:", text[start.end() :], re.M) if start else None
    if start is None or end is None:
        raise ValueError(f"ISA has no body for kernel {name!r}")
    out = []
    for raw in text[start.end() : start.end() + end.start()].splitlines():
        line = raw.split(";", 1)[0].strip()
        if line and not line.startswith((".p2align", ".cfi")):
            out.append(line)
    return tuple(out)


def _directive(text: str, name: str, default: int = 0) -> int:
    m = re.search(rf"^\s*\.{name}\s+(\d+)\s*$", text, re.M)
    return int(m.group(1)) if m else default


def parse_isa(text: str) -> KernelIsa:
    """The one kernel of a FlyDSL final-ISA file (mono builds one kernel per module)."""
    meta = _META.search(text)
    if meta is None:
        raise ValueError("ISA carries no .amdgpu_metadata block")
    scalars: dict[str, str] = {}
    args: list[KernelArg] = []
    current: dict[str, str] | None = None
    names = []
    for line in meta.group(1).splitlines():
        if line.startswith("  - ."):
            names.append(line)
            line = "    " + line[4:]
        if m := _ARG.match(line):
            current = {"offset": m.group(1)}
            args.append(current)  # type: ignore[arg-type]
        elif (m := _ARG_FIELD.match(line)) and current is not None:
            current[m.group(1)] = m.group(2)
        elif m := _SCALAR.match(line):
            scalars.setdefault(m.group(1), m.group(2))
            current = None
    if len(names) != 1:
        raise ValueError(f"ISA holds {len(names)} kernels; expected one")
    arch_m = re.search(r'\.amdgcn_target\s+"[^"]*-(gfx\w+)', text)
    vgprs = int(scalars.get("vgpr_count", 0))
    agprs = int(scalars.get("agpr_count", 0))
    accum = _directive(text, "amdhsa_accum_offset", vgprs)
    unified = (accum + agprs) if agprs else vgprs
    total = max(_directive(text, "amdhsa_next_free_vgpr", vgprs), unified)
    resources = Resources(
        vgprs=vgprs,
        agprs=agprs,
        total_vgprs=total,
        sgprs=int(scalars.get("sgpr_count", 0)),
        lds_bytes=int(scalars.get("group_segment_fixed_size", 0)),
        scratch_bytes=int(scalars.get("private_segment_fixed_size", 0)),
        vgpr_spills=int(scalars.get("vgpr_spill_count", 0)),
        sgpr_spills=int(scalars.get("sgpr_spill_count", 0)),
        max_threads=int(scalars.get("max_flat_workgroup_size", 0)),
        wave_size=int(scalars.get("wavefront_size", 64)),
    )
    name = scalars["name"]
    kargs = tuple(
        KernelArg(int(a["offset"]), int(a["size"]), a.get("value_kind", "")) for a in args
    )  # type: ignore[index]
    arch = arch_m.group(1) if arch_m else ""
    return KernelIsa(name, arch, text, _body(text, name), resources, kargs)
