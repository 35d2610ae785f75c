"""Which of a module's functions a compiled kernel's instructions come from: PTX
instructions attributed, by their `.loc` lines (the instruction's own line, or the line
that inlined it), to the top-level functions of one source file.

Why: a persistent kernel inlines every stage's helper into one body, so its compile time
and binary size come from a few helpers; this names them. (Whether a once-run item's code
is its latency: `bench_icache` found cold code free on an H100, in L2 or swept from
it, so size is worth shrinking for compile time, not speed.) Approximate: an
instruction inlined through several levels counts where its innermost call into the
file was made. Example (sm_90, no GPU needed):

    from mono_kernels_kimi.k2 import triton_build
    k = triton_build.compile_for(K2Build(rank_config(), 1, frag=True), "sm90")
    by_function(k.asm["ptx"], triton_build.__file__).most_common(20)
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

_FILE = re.compile(r'\.file\s+(\d+)\s+"([^"]+)"')
_LOC = re.compile(r"\.loc\s+(\d+)\s+(\d+)\s+\d+(?:,.*?inlined_at\s+(\d+)\s+(\d+))?")


def _functions(path: str) -> list[tuple[int, int, str]]:
    tree = ast.parse(Path(path).read_text())
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    ]


def by_function(ptx: str, source: str) -> Counter:
    """PTX instructions of `ptx` per top-level function of the file `source` ("?": before
    any line of it, or between its functions)."""
    name = Path(source).name
    ids = {m.group(1) for m in _FILE.finditer(ptx) if Path(m.group(2)).name == name}
    spans = _functions(source)

    def owner(line: int) -> str:
        return next((f for a, b, f in spans if a <= line <= b), "?")

    counts: Counter = Counter()
    current = "?"
    for raw in ptx.splitlines():
        line = raw.strip()
        if line.startswith(".loc"):
            m = _LOC.match(line)
            if m and m.group(1) in ids:
                current = owner(int(m.group(2)))
            elif m and m.group(3) in ids:
                current = owner(int(m.group(4)))
        elif line and not line.startswith(("//", ".", "$", "{", "}")):
            counts[current] += 1
    return counts
