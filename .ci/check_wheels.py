"""Check the built wheels: one per member, dependencies as version ranges, no paths."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

MEMBERS = {
    "mono_peer",
    "mono_runtime",
    "mono_kernels_minimax",
    "mono_kernels_kimi",
    "mono_vllm",
    "mono_tools",
}


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def main(folder: str) -> int:
    wheels = sorted(Path(folder).glob("*.whl"))
    names = {w.name.split("-")[0] for w in wheels}
    problems = [f"no wheel for {m}" for m in sorted(MEMBERS - names)]
    for wheel in wheels:
        for req in requirements(wheel):
            if "@" in req or "file:" in req:
                problems.append(f"{wheel.name}: path or URL dependency {req!r}")
            if req.replace("_", "-").startswith("mono-") and not any(
                op in req for op in (">=", "<", "~=", "==")
            ):
                problems.append(f"{wheel.name}: unversioned member dependency {req!r}")
        print(f"{wheel.name}: {', '.join(requirements(wheel))}")
    for p in problems:
        print("wheel check:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
