"""The FFN's builds on mono_runtime's Build interface, registered for `mono qualify` and
`mono bench`: Triton (CUDA GPUs and the CPU interpreter; compiled ahead of time for sm_90)
and FlyDSL (AMD gfx950 / gfx942; ahead of time for gfx950).

Each wraps its backend module (triton_build, flydsl_build) around one FfnBuild key; the
runner picks one per device (runner.choose_build) and warms and launches through it. Both
take one argument list, `launch_spec`: spec.ARGS with the layer's weights as one
FfnWeights bundle (each backend unpacks it), then the runtime's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import torch
from mono_runtime.flydsl.testing import toolchain_missing
from mono_runtime.flydsl.toolchain import ARCHES
from mono_runtime.kernel import (
    INTERPRETER,
    RUNTIME_ARGS,
    Arg,
    Build,
    Compiled,
    KernelSpec,
    target_name,
)
from mono_runtime.kernel.registry import register
from mono_runtime.kernel.triton_build import TritonBuild, gluon_refusal, warm_triton

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from . import flydsl_build, triton_build
from .spec import ARGS, Experts, FfnBuild
from .weights import FfnWeights

OWN_ARGS = (  # name, type, layout; "weights" stands for spec.ARGS norm..sw2_scale
    ("part", "*bf16", ""),
    ("residual", "*bf16", ""),
    ("out", "*bf16", ""),
    ("residual_out", "*bf16", ""),
    ("slots", "*i64", ""),
    ("weights", FfnWeights, None),
    ("scratch", "*u8", "spec.scratch_layout"),
    ("slot", "i32", ""),
    ("final", "i1", ""),
)


def launch_spec(b: FfnBuild) -> KernelSpec:
    """What a launch of `b` takes, by name: triton_build.kernel_args's keywords (and
    flydsl_build's), with spec.ARGS's docs; the weights in `b`'s layout."""
    docs = {
        **dict(ARGS),
        "weights": "the layer's FfnWeights: norm, router, bias, experts, shared expert",
    }
    own = tuple(
        Arg(name, kind, docs[name], b.layout if layout is None else layout)
        for name, kind, layout in OWN_ARGS
    )
    return KernelSpec("ffn", own + RUNTIME_ARGS)


def _example() -> FfnBuild:
    """What the compile checks compile: a TP4 rank's 4-row step of MiniMax-M3, MXFP4."""
    return FfnBuild(MiniMaxM3Config(), 4, 4, WeightFormat.MXFP4)


class _Ffn(Build):
    family = "ffn"
    key: FfnBuild

    @classmethod
    def example(cls) -> Build:
        return cls(_example())

    @cached_property
    def spec(self) -> KernelSpec:
        return launch_spec(self.key)


SDOWN_FAULT_ROWS = 8
"""Rows from which the Triton build's bf16 shared-expert down stage is wrong on a GPU."""


def sdown_fault(b: FfnBuild) -> str | None:
    """Why the Triton build must not run `b` on a GPU, or None. Its shared expert's down
    stage (`sdown`, stop 41) in bf16 lands nothing on an H100 at S = 8 and 16 (tiny
    shapes, bf16 and MXFP4 experts: the shared expert's output is zero, its `mid` and the
    routed experts exact) and at S = 8 at a TP4 rank's shapes (MXFP4: out rel-L2 0.73);
    S = 1-7, 9 and 12 were right, FP8's shared expert and the Gluon build at every width.
    Not found yet (stop 57): widths from SDOWN_FAULT_ROWS are refused rather than served
    wrong; the interpreter computes them right."""
    shared = b.experts is not Experts.ROUTED
    if shared and b.weights.shared_format is WeightFormat.BF16 and b.rows >= SDOWN_FAULT_ROWS:
        return (
            f"width {b.rows}: the FFN's Triton build computes its bf16 shared expert's down "
            f"stage wrong on CUDA GPUs at {SDOWN_FAULT_ROWS} rows and more (found in stop 57, "
            "not yet fixed); packed MXFP4 or FP8 experts take the Gluon build, which is right"
        )
    return None


@register
class FfnTriton(TritonBuild, _Ffn):
    """The Triton build (triton_build): the streaming plan, tuned on the H200."""

    backend = "triton"
    targets = ("sm90",)
    module = triton_build

    def supports(self, target: str) -> str | None:
        if self.key.frag:
            return "frag layouts stream in the FFN's Gluon build, not its Triton build"
        if target == INTERPRETER:
            return None
        if target.startswith("sm"):
            return sdown_fault(self.key)
        return f"the FFN's Triton build serves CUDA GPUs; on {target} its FlyDSL build does"

    def warm(self, programs: int, **args: Any) -> None:
        """Compile and load the launch's binary, then refuse a grid that cannot be resident
        at once (mono_runtime.kernel.triton_build); nothing on a CPU."""
        self.spec.check(args)
        warm_triton(
            triton_build.kernel_of(self.key),
            triton_build.kernel_args(self.key, **args),
            triton_build.constexprs(self.key, False),
            programs=programs,
            num_warps=self.key.plan.warps,
            maxnreg=self.key.plan.regs or None,
            device=args["scratch"].device,
            what=f"FFN width {self.key.rows}",
        )


@register
class FfnFlyDsl(_Ffn):
    """The FlyDSL build (flydsl_build): bf16 and mxfp4-k32 experts; it compiles in child
    processes, so warming every width shares them."""

    backend = "flydsl"
    targets = ("gfx950",)

    def supports(self, target: str) -> str | None:
        if target not in ARCHES:
            return f"the FFN's FlyDSL build serves {' and '.join(ARCHES)}, not {target}"
        try:
            flydsl_build.check_build(self.key)
        except flydsl_build.FlyDslUnsupported as err:
            return str(err)
        return None

    def compiler_missing(self) -> str | None:
        return toolchain_missing()

    def _compile(self, target: str) -> Compiled:
        (isa,) = flydsl_build.compile_isa([self.key], target, processes=1)
        res = isa.resources
        problem = flydsl_build.residency_problem(isa)
        return Compiled(target, res.lds_bytes, res.vgpr_spills, problem, isa)

    def warm(self, programs: int, **args: Any) -> None:
        self.warm_all([(self, args)], programs)

    @classmethod
    def warm_all(cls, launches: Sequence[tuple[Build, Mapping[str, Any]]], programs: int) -> None:
        """Compile every build in shared child processes and refuse, naming each, a build
        whose grid cannot be resident; its first launch loads it (flydsl_build.launch)."""
        if not launches:
            return
        for build, args in launches:
            build.spec.check(args)
        device = launches[0][1]["scratch"].device
        flydsl_build.check_resident(
            [build.key for build, _ in launches],
            target_name(device),
            programs=programs,
            cus=torch.cuda.get_device_properties(device).multi_processor_count,
        )

    def launch(self, programs: int, **args: Any) -> None:
        self.spec.check(args)
        flydsl_build.launch(self.key, programs, **args)


@register
class FfnGluon(FfnTriton):
    """The Gluon build: triton_build's kernel body compiled by Gluon, its expert stages on
    the mma.sync engine (mono_runtime.stream.frag_gluon) over ``mxfp4-frag`` experts (a
    bf16 shared expert) or ``fp8-frag`` experts and shared expert.
    Gluon has no interpreter: the Triton build, the same body, is its CPU twin."""

    backend = "gluon"

    @classmethod
    def example(cls) -> Build:
        return cls(replace(_example(), frag=True))

    def supports(self, target: str) -> str | None:
        if not self.key.frag:
            return (
                "the FFN's Gluon build streams packed MXFP4 or FP8 experts in their frag "
                "layouts (frag=True)"
            )
        b, p = self.key, self.key.plan
        h, i = b.cfg.hidden_size, b.inter
        steps = {
            "routed up": h // p.ubk // p.uks,
            "shared up": h // p.ubk0 // p.uks0,
            f"routed down (I = {i} a rank)": i // p.dbk,
            "shared down": i // p.dbk0,
        }
        frag_bk = {"ubk": p.ubk, "dbk": p.dbk}
        if b.weights is WeightFormat.FP8:  # the shared expert in fp8-frag too
            frag_bk.update(ubk0=p.ubk0, dbk0=p.dbk0)
        return gluon_refusal(target, steps, frag_bk)


BY_BACKEND: dict[str, type[_Ffn]] = {
    "triton": FfnTriton,
    "gluon": FfnGluon,
    "flydsl": FfnFlyDsl,
}
