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


def hot_loop(sass: str) -> list[str]:
    """Instructions of the largest loop: from a backward branch's target to the branch."""
    ins = [
        (int(m.group(1), 16), m.group(2).strip()) for m in map(_LINE.match, sass.splitlines()) if m
    ]
    best: list[str] = []
    for addr, text in ins:
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            best = body if len(body) > len(best) else best
    return best


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


def loop_cost(kernel: Any, values_per_trip: int) -> LoopCost:
    """Cost of `kernel`'s hot loop when one trip consumes `values_per_trip` weight values
    across its warps (a GEMV step: BN x BK)."""
    body = hot_loop(sass_of(kernel))
    if not body:
        raise ValueError("no loop in the kernel's SASS")
    ops = collections.Counter(_GUARD.sub("", t).split()[0].split(".")[0] for t in body)
    warps = kernel.metadata.num_warps
    return LoopCost(len(body), len(body) * warps / values_per_trip, dict(ops))
