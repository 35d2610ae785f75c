"""Compile FlyDSL kernels for gfx950 / gfx942 in a child process and read back their ISA.

A FlyDSL compile can abort the whole process (SIGABRT on an intrinsic the target lacks, or
on any launch without a GPU), so compiles never run in the caller's process. One child
compiles a list of jobs (FlyDSL's import costs seconds, a small kernel well under one);
``compile_all`` spreads jobs over several children.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .isa import KernelIsa, parse_isa
from .toolchain import compile_env, rocm_root


@dataclass(frozen=True)
class Job:
    """``builder`` ("package.module:function") called with ``kwargs`` returns
    ``(launch, args)``: a ``flyc.jit`` launcher and the example arguments to compile it with.
    """

    builder: str
    kwargs: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"builder": self.builder, "kwargs": self.kwargs}


class FlyCompileError(RuntimeError):
    """A FlyDSL compile failed (or its process died); the message carries its output."""


def _tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def compile_jobs(jobs: list[Job], arch: str = "gfx950", timeout_s: float = 600) -> list[KernelIsa]:
    """Compile ``jobs`` in one child process; each job's one kernel, in order."""
    if not jobs:
        return []
    with tempfile.TemporaryDirectory(prefix="mono-flydsl-") as tmp:
        root = Path(tmp)
        env = compile_env(arch, rocm_root(root / "rocm"), root / "dump", root / "cache")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        spec = {"dump": str(root / "dump"), "jobs": [j.to_json() for j in jobs]}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "mono_runtime.flydsl._child", json.dumps(spec)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as e:
            raise FlyCompileError(
                f"FlyDSL compile of {len(jobs)} job(s) for {arch} ran past {timeout_s:.0f} s"
            ) from e
        started = [ln for ln in proc.stdout.splitlines() if ln.startswith("MONO-JOB ")]
        if proc.returncode != 0:
            which = jobs[len(started) - 1] if started else jobs[0]
            raise FlyCompileError(
                f"FlyDSL compile for {arch} failed (exit {proc.returncode}) in job {which}:\n"
                f"{_tail(proc.stderr + proc.stdout)}"
            )
        out = []
        for i, job in enumerate(jobs):
            found = sorted((root / "dump" / str(i)).glob("*/*final_isa.s"))
            if len(found) != 1:
                raise FlyCompileError(
                    f"{job}: expected one final ISA, found {len(found)}:\n"
                    f"{_tail(proc.stderr + proc.stdout)}"
                )
            out.append(parse_isa(found[0].read_text()))
        return out


def compile_all(
    jobs: list[Job], arch: str = "gfx950", processes: int | None = None, timeout_s: float = 600
) -> list[KernelIsa]:
    """``compile_jobs`` spread round-robin over ``processes`` children (default: CPUs)."""
    n = max(1, min(processes or os.cpu_count() or 1, len(jobs)))
    shards = [list(range(k, len(jobs), n)) for k in range(n)]
    with ThreadPoolExecutor(n) as pool:
        results = list(
            pool.map(lambda idx: compile_jobs([jobs[i] for i in idx], arch, timeout_s), shards)
        )
    out: list[KernelIsa | None] = [None] * len(jobs)
    for idx, got in zip(shards, results, strict=True):
        for i, isa in zip(idx, got, strict=True):
            out[i] = isa
    return out  # type: ignore[return-value]
