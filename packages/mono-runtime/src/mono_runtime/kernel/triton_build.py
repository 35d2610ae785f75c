"""Triton builds: what every Build whose backend is one Triton kernel does alike.

Why here: each Triton Build compiles ahead of time, warms and launches through its
backend module the same way (`TritonBuild`), and warming is one sequence (`warm_triton`:
warmup with the launch's exact arguments, constexprs and warps, so the binary is the one
that launches; then the residency check); a copy per kernel would drift (one forgetting
`num_warps` warms a binary that never runs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..builds import DeviceLimits, Resources, residency_problem
from ..errors import MonoUnsupported
from .build import Build, Compiled


def warm_triton(
    kernel: Any,
    args: Sequence[Any],
    constexprs: Mapping[str, Any],
    *,
    programs: int,
    num_warps: int,
    device: Any,
    what: str,
    maxnreg: int | None = None,
) -> None:
    """Compile and load `kernel` on `args` (a launch's runtime arguments) for a grid of
    `programs`, then raise MonoUnsupported, naming `what`, when that grid cannot be
    resident at once on `device`. Nothing on a CPU (the interpreter compiles nothing).
    `maxnreg`: the launch's register cap, if it sets one (it is part of the binary)."""
    if device.type == "cpu":
        return
    cap = {"maxnreg": maxnreg} if maxnreg else {}
    compiled = kernel.warmup(*args, grid=(programs,), **constexprs, num_warps=num_warps, **cap)
    problem = residency_problem(
        Resources.of_compiled(compiled), programs, DeviceLimits.of(device), what
    )
    if problem:
        raise MonoUnsupported(problem)


class TritonBuild(Build):
    """A Build whose backend module (`module`) holds `compile_for(key, target)` (a Triton
    CompiledKernel) and `launch(key, grid, cpu, **args)`; the subclass adds `warm`."""

    module: ClassVar[Any]

    def _compile(self, target: str) -> Compiled:
        kernel = self.module.compile_for(self.key, target)
        return Compiled(target, kernel.metadata.shared, binary=kernel)

    def launch(self, programs: int, **args: Any) -> None:
        self.spec.check(args)
        self.module.launch(self.key, programs, args["scratch"].device.type == "cpu", **args)


def gluon_refusal(target: str, steps: Mapping[str, int], frag_bk: Mapping[str, int]) -> str | None:
    """Why a kernel body compiled by Gluon (its weights on `stream.frag_gluon`) cannot
    serve `target`, or None: it needs NVIDIA sm_90+ (no interpreter), every weight stream
    of >= 2 K steps (`steps`: name -> count; triton 3.6's Gluon fails to lower the ring of
    a one-step loop) and its ``mxfp4-frag`` / ``fp8-frag`` streams K steps of whole
    64-column blocks (`frag_bk`: name -> step)."""
    if target == "interpreter":
        return "Gluon has no interpreter; on a CPU the Triton build (the same body) runs"
    arch = target[2:] if target.startswith("sm") else ""
    if not arch.isdigit() or int(arch) < 90:
        return f"the Gluon build serves NVIDIA sm_90 and later, not {target}"
    one = sorted(name for name, n in steps.items() if n < 2)
    if one:
        return (
            f"a weight stream of one K step ({', '.join(one)}): triton 3.6's Gluon cannot "
            "lower its ring; the Triton build serves this shape"
        )
    odd = sorted(name for name, bk in frag_bk.items() if bk % 64)
    if odd:
        return f"frag K steps must be multiples of 64 ({', '.join(odd)})"
    return None
