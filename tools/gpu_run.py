"""Run the repo's GPU tests (and benchmarks) from source on a machine with torch and triton.

The GPU machine has none of our packages installed and cannot download any: every member's
`src/` goes on PYTHONPATH, pytest runs the `gpu`-marked tests, and a short table of
outcomes is printed last. Usage (from the repo root):

    python3 tools/gpu_run.py [--out DIR] [--bench CMD ...] [-- extra pytest args]

`--bench` takes a `mono` subcommand line (e.g. "bench ffn --rows 1,16"), run after the tests
with the same environment; repeatable.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    "packages/mono-peer/src",
    "packages/mono-runtime/src",
    "packages/mono-kernels-minimax/src",
    "packages/mono-kernels-kimi/src",
    "integration/src",
    "tools/src",
]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / s) for s in SOURCES]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def outcomes(junit: Path) -> list[tuple[str, str, float, str]]:
    """(test id, outcome, seconds, first line of the message) for each test case."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                message = (node.get("message") or "").splitlines()[0:1]
                message = message[0] if message else ""
                break
        rows.append((name, outcome, float(case.get("time", 0.0)), message))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-run-out"))
    parser.add_argument("--bench", action="append", default=[], help="a mono subcommand line")
    parser.add_argument("--marker", default="gpu", help="pytest -m expression (default: gpu)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    junit = out / "junit.xml"
    start = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        args.marker,
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-p",
        "mono_tools.instant_failures",
        *args.pytest_args,
    ]
    print("+", shlex.join(cmd), flush=True)
    status = subprocess.call(cmd, cwd=ROOT, env=env)
    bench_status = []
    for line in args.bench:
        bcmd = [sys.executable, "-m", "mono_tools.cli", *shlex.split(line)]
        print("+", shlex.join(bcmd), flush=True)
        bench_status.append((line, subprocess.call(bcmd, cwd=ROOT, env=env)))
    print(f"\n== GPU run summary ({time.monotonic() - start:.0f} s) ==")
    if junit.exists():
        for name, outcome, seconds, message in outcomes(junit):
            print(f"{outcome:8s} {seconds:7.2f}s  {name}  {message[:100]}")
    for line, rc in bench_status:
        print(f"{'ok' if rc == 0 else 'FAILED':8s} bench: mono {line} (exit {rc})")
    print(f"pytest exit status: {status}")
    return status or max((rc for _, rc in bench_status), default=0)


if __name__ == "__main__":
    sys.exit(main())
