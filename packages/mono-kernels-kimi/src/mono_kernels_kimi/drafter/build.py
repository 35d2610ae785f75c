"""The drafter kernel on mono_runtime's Build interface, registered for `mono qualify` and
`mono bench`: the Triton build (CUDA GPUs and the CPU interpreter; compiled ahead of time
for sm_90, and checked to compile for gfx950).

The launch spec is spec.ARGS then the runtime's words, so the runner, the compile checks
and `mono` name one argument list.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from mono_runtime.kernel import INTERPRETER, RUNTIME_ARGS, Arg, Build, KernelSpec
from mono_runtime.kernel.registry import register
from mono_runtime.kernel.triton_build import TritonBuild, warm_triton

from . import triton_build
from .config import k3_dspark
from .spec import ARGS, DrafterBuild

OWN_ARGS = (
    ("embeds", "*bf16", ""),
    ("positions", "*i64", ""),
    ("slot_mapping", "*i64", ""),
    ("block_table", "*i32", ""),
    ("seq_lens", "*i32", ""),
    ("out", "*bf16", ""),
    ("table", "*i64", "spec.LAYER_POINTERS"),
    ("final_norm", "*bf16", ""),
    ("rope", "*fp32", ""),
    ("scratch", "*u8", "spec.scratch_layout"),
    ("nreq", "i32", ""),
    ("slot", "i32", ""),
)


def launch_spec(b: DrafterBuild) -> KernelSpec:
    """What a launch of `b` takes, by name: triton_build.kernel_args's keywords."""
    docs = dict(ARGS)
    own = tuple(Arg(name, kind, docs[name], layout) for name, kind, layout in OWN_ARGS)
    return KernelSpec("drafter", own + RUNTIME_ARGS)


@register
class DrafterTriton(TritonBuild):
    """The Triton build (triton_build)."""

    family = "drafter"
    backend = "triton"
    targets = ("sm90",)
    module = triton_build
    key: DrafterBuild

    @classmethod
    def example(cls) -> Build:
        """A TP8 rank of the Kimi-K3 drafter (sizes the wheel does not state are the
        assumed ones of `k3_dspark`'s caller: 64 heads of 128 + 64, v 128), wide."""
        cfg = k3_dspark(
            num_attention_heads=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            intermediate_size=18432,
            hidden_act="silu",
            rms_norm_eps=1e-6,
            max_position_embeddings=262144,
            num_speculative_tokens=7,
            block_size=64,
            tp=8,
        )
        return cls(DrafterBuild(cfg, wide=True))

    @cached_property
    def spec(self) -> KernelSpec:
        return launch_spec(self.key)

    def supports(self, target: str) -> str | None:
        if target == INTERPRETER or target.startswith("sm") or target.startswith("gfx"):
            return None
        return f"the drafter's Triton build serves GPUs and the interpreter, not {target}"

    def warm(self, programs: int, **args: Any) -> None:
        """Compile and load (Triton's warmup), then refuse a grid that cannot be resident
        at once; nothing on a CPU (the interpreter compiles nothing)."""
        self.spec.check(args)
        warm_triton(
            triton_build.drafter_kernel,
            triton_build.kernel_args(self.key, **args),
            triton_build.constexprs(self.key, False),
            programs=programs,
            num_warps=self.key.plan.warps,
            device=args["scratch"].device,
            what=f"drafter {'wide' if self.key.wide else 'narrow'}",
        )
