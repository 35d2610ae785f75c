"""Warming a Triton build: the one place a Triton kernel is compiled and loaded for the
device it will run on, and its grid checked against what that device holds at once.

Why one helper: each Triton Build's `warm` is this same sequence (warmup with the launch's
exact arguments, constexprs and warps, so the binary is the one that launches; then the
residency check); a copy per kernel would drift (one forgetting `num_warps` warms a
binary that never runs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..builds import DeviceLimits, Resources, residency_problem
from ..errors import MonoUnsupported


def warm_triton(
    kernel: Any,
    args: Sequence[Any],
    constexprs: Mapping[str, Any],
    *,
    programs: int,
    num_warps: int,
    device: Any,
    what: str,
) -> None:
    """Compile and load `kernel` on `args` (a launch's runtime arguments) for a grid of
    `programs`, then raise MonoUnsupported, naming `what`, when that grid cannot be
    resident at once on `device`. Nothing on a CPU (the interpreter compiles nothing)."""
    if device.type == "cpu":
        return
    compiled = kernel.warmup(*args, grid=(programs,), **constexprs, num_warps=num_warps)
    problem = residency_problem(
        Resources.of_compiled(compiled), programs, DeviceLimits.of(device), what
    )
    if problem:
        raise MonoUnsupported(problem)
