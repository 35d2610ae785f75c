"""K2 on mono_runtime's Build interface, registered for `mono qualify` and `mono bench`:
the Triton build (CUDA GPUs and the CPU interpreter; compiled ahead of time for sm_90,
and checked to compile for gfx950).

The launch spec is spec.ARGS (the layer's weights as one K2Weights bundle, which
triton_build.kernel_args unpacks) then the runtime's words, so the runner, the compile
checks and `mono` name one argument list.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from mono_runtime.kernel import INTERPRETER, RUNTIME_ARGS, Arg, Build, KernelSpec
from mono_runtime.kernel.registry import register
from mono_runtime.kernel.triton_build import TritonBuild, gluon_refusal, warm_triton

from ..config import KimiK3Config
from . import triton_build
from .spec import ARGS, K2Build
from .weights import K2Weights

OWN_ARGS = (  # name, type, layout (None: the build's expert layout)
    ("core", "*bf16", ""),
    ("prefix", "*bf16", ""),
    ("blocks", "*bf16", ""),
    ("out", "*bf16", ""),
    ("slots", "*i64", ""),
    ("weights", K2Weights, None),
    ("scratch", "*u8", "spec.scratch_layout"),
    ("sources", "i32", ""),
    ("reset", "i1", ""),
    ("slot", "i32", ""),
    ("final", "i1", ""),
)


def launch_spec(b: K2Build) -> KernelSpec:
    """What a launch of `b` takes, by name: triton_build.kernel_args's keywords."""
    docs = dict(ARGS)
    own = tuple(
        Arg(name, kind, docs[name], b.layout if layout is None else layout)
        for name, kind, layout in OWN_ARGS
    )
    return KernelSpec("k2", own + RUNTIME_ARGS)


@register
class K2Triton(TritonBuild):
    """The Triton build (triton_build)."""

    family = "k2"
    backend = "triton"
    targets = ("sm90",)
    module = triton_build
    key: K2Build

    @classmethod
    def example(cls) -> Build:
        """A TP8 rank of Kimi-K3 at 4 rows."""
        return cls(K2Build(KimiK3Config(tp=8), 4))

    @cached_property
    def spec(self) -> KernelSpec:
        return launch_spec(self.key)

    def supports(self, target: str) -> str | None:
        if self.key.frag:
            return "mxfp4-frag experts stream in K2's Gluon build, not its Triton build"
        if target == INTERPRETER or target.startswith("sm") or target.startswith("gfx"):
            return None
        return f"K2's Triton build serves GPUs and the interpreter, not {target}"

    def warm(self, programs: int, **args: Any) -> None:
        """Compile and load the launch's binary, then refuse a grid that cannot be resident
        at once (mono_runtime.kernel.triton_build); nothing on a CPU."""
        self.spec.check(args)
        warm_triton(
            triton_build.kernel_of(self.key),
            triton_build.kernel_args(self.key, **args),
            triton_build.constexprs(self.key, False, triton_build.native_asm()),
            programs=programs,
            num_warps=self.key.plan.warps,
            device=args["scratch"].device,
            what=f"K2 width {self.key.rows}",
        )


@register
class K2Gluon(K2Triton):
    """The Gluon build: triton_build's kernel body compiled by Gluon, every weight stream on
    the mma.sync engine (decode_triton.any_stream_rows), experts in ``mxfp4-frag``. Its
    Triton twin runs the same body on a CPU. H200 (stop 38): 1.08-1.21x the Triton build's
    speed at S = 1 / 4 / 16; a runner takes it when asked (`engine="gluon"`)."""

    backend = "gluon"

    @classmethod
    def example(cls) -> Build:
        return cls(K2Build(KimiK3Config(tp=8), 4, frag=True))

    def supports(self, target: str) -> str | None:
        b, p = self.key, self.key.plan
        if not b.frag:
            return "K2's Gluon build streams experts in mxfp4-frag (frag=True)"
        c = b.cfg
        steps = {
            "o_proj": c.o_proj_in // p.obk,
            "router / latent down / shared up": c.hidden_size // p.dks // p.rbk,
            "shared down": c.shared_intermediate // p.sdk,
            "routed up": c.latent_size // p.ubk,
            "up_proj": c.latent_size // p.pbk,
            "routed down": c.routed_intermediate // p.dbk,
        }
        return gluon_refusal(target, steps, {"ubk": p.ubk, "dbk": p.dbk})


BY_BACKEND = {"triton": K2Triton, "gluon": K2Gluon}
