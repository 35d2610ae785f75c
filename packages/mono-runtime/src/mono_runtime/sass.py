"""What a compiled sm_90 loop costs, read from its SASS without a GPU.

A weight-streaming loop is instruction-bound long before it is byte-bound (an H200 SM
issues 4 warp-instructions a clock and must take ~26 MXFP4 values a clock to stream at
75% of HBM), so the number that decides a decode design is warp-instructions per weight
value of the hot loop. This disassembles a Triton CompiledKernel's cubin with the
`cuobjdump` Triton bundles and counts the largest loop (the body of the longest backward
branch): a CPU test can hold a kernel to it, and tuning can rank variants before any GPU
time is spent.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
_GUARD = re.compile(r"^@!?U?P\w+\s+")


def cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass_of(kernel: Any) -> str:
    """SASS text of a Triton CompiledKernel built for an NVIDIA target."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run(
            [cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True, timeout=120
        ).stdout


def loops(sass: str) -> list[list[str]]:
    """Instructions of every innermost loop (from a backward branch's target to the branch,
    holding no other such span), largest first."""
    ins = [
        (int(m.group(1), 16), m.group(2).strip()) for m in map(_LINE.match, sass.splitlines()) if m
    ]
    spans = []
    for addr, text in ins:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < addr:
            spans.append((int(m.group(1), 16), addr))
    inner = [a for a in spans if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in spans)]
    return sorted(([t for x, t in ins if lo <= x <= hi] for lo, hi in inner), key=len, reverse=True)


def hot_loop(sass: str) -> list[str]:
    """The largest innermost loop's instructions (empty without a loop)."""
    found = loops(sass)
    return found[0] if found else []


_WGMMA = re.compile(r"HGMMA\.(\d+)x\d+x(\d+)")


def wgmma_values(body: list[str], warps: int) -> int:
    """Weight values a trip of `body` feeds the tensor cores as the wgmma A operand: M x K
    of each HGMMA, once per warpgroup."""
    per = sum(int(m.group(1)) * int(m.group(2)) for m in map(_WGMMA.search, body) if m)
    return per * max(warps // 4, 1)


@dataclass(frozen=True)
class LoopCost:
    """The hot loop of one compiled kernel: instructions per warp per trip, and per value."""

    instructions: int  # per warp, one trip
    per_value: float  # warp-instructions per weight value a trip consumes
    opcodes: dict[str, int]  # opcode (without modifiers) -> count in the body

    def __str__(self) -> str:
        top = ", ".join(
            f"{k} {v}" for k, v in sorted(self.opcodes.items(), key=lambda x: -x[1])[:8]
        )
        return f"{self.instructions} instr/warp/trip, {self.per_value:.3f} per value ({top})"


def loop_cost(
    kernel: Any, values_per_trip: int | None = None, body: list[str] | None = None
) -> LoopCost:
    """Cost of `kernel`'s hot loop (or of `body`, one of its `loops`) when one trip consumes
    `values_per_trip` weight values across its warps (a GEMV step: BN x BK; default: the
    trip's wgmma A operands)."""
    body = hot_loop(sass_of(kernel)) if body is None else body
    if not body:
        raise ValueError("no loop in the kernel's SASS")
    warps = kernel.metadata.num_warps
    values = wgmma_values(body, warps) if values_per_trip is None else values_per_trip
    if not values:
        raise ValueError("the loop feeds no wgmma: give values_per_trip")
    ops = collections.Counter(_GUARD.sub("", t).split()[0].split(".")[0] for t in body)
    return LoopCost(len(body), len(body) * warps / values, dict(ops))


def split_broadcasts(sass: str) -> list[str]:
    """SASS addresses of value-returning global atomics (a scalar `tl.atomic_*`, such as a
    ticket draw: one lane draws, then shared memory and a barrier hand the value to every
    warp) that sit under a per-thread branch with no reconvergence (BSYNC, WARPSYNC) before
    that barrier. Warp 0 then reaches the barrier split, and from there the program's
    warps pair their barriers one apart: garbage tickets (the drafter's H200 fault at 2+
    warps, when its first draw sat before a two-entry loop). Empty is what a kernel needs."""
    ins = [(m.group(1), m.group(2).strip()) for m in map(_LINE.match, sass.splitlines()) if m]
    bad = []
    for i, (addr, text) in enumerate(ins):
        if not re.search(r"\bATOMG\.", text) or "PT, RZ," in text:
            continue  # not an atomic, or one whose value is dropped
        j = i
        while j > 0 and not re.search(r"\bBRA\b|BAR\.SYNC|BSYNC|WARPSYNC", ins[j][1]):
            j -= 1
        if not re.match(r"@!?P\d+\s+BRA", ins[j][1]):
            continue  # not under a per-thread branch
        k = i + 1
        while k < len(ins) and not re.search(r"BAR\.SYNC|BSYNC|WARPSYNC|EXIT", ins[k][1]):
            k += 1
        if k < len(ins) and "BAR.SYNC" in ins[k][1]:
            bad.append(addr)
    return bad


_NARROW_LOAD = re.compile(r"\bLDG\.E\.[US](8|16)\b")


def narrow_stream_loads(sass: str) -> list[int]:
    """Byte and 2-byte global loads in each innermost loop that feeds the tensor cores (a
    loop with HGMMA or HMMA), largest loop first; loops without either are left out. A
    streaming loop must read its weights by 16-byte async copies: Triton falls back to
    2-byte loads when it cannot prove an address 16-byte aligned (a pointer loaded from a
    table, unless declared with `tl.multiple_of`) or when a mask varies along a row, and the
    stream then runs several times slower (the drafter's, 0.3 TB/s on the H200)."""
    return [
        sum(1 for t in body if _NARROW_LOAD.search(t))
        for body in loops(sass)
        if any(re.search(r"\bH(G)?MMA\b", t) for t in body)
    ]
