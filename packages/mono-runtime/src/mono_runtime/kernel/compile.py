"""`python -m mono_runtime.kernel.compile MODULE NAME TARGET`: compile one registered
build's example for TARGET and print what it produced as one JSON line.

Why a child process: a backend can abort its process (FlyDSL on an intrinsic the target
lacks, an LLVM assertion), and that must fail one check, not the rank that asked. MODULE
is the build's registration module (the child imports only it), NAME its registry name.
"""

from __future__ import annotations

import json
import sys

from . import registry


def main(argv: list[str] | None = None) -> int:
    module, name, target = sys.argv[1:] if argv is None else argv
    registry.load([module])
    compiled = registry.get(name).example().compile_for(target)
    facts = {"target": compiled.target, "shared": compiled.shared, "spills": compiled.spills}
    print(json.dumps({**facts, "problem": compiled.problem}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
