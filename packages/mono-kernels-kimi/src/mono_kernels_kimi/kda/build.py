"""K1 on mono_runtime's Build interface, registered for `mono qualify` and `mono bench`:
the Triton build (every GPU and the CPU interpreter; compiled ahead of time for sm_90).

A first step: KdaRunner still launches through triton_build itself (K1 launches through
this Build in its own issue); what is here is the spec of a launch (spec.ARGS, the tag
slot, `final`, then the runtime's words), the compile check and a `launch` / `warm` that
take those by name.
"""

from __future__ import annotations

from typing import Any

from mono_runtime.kernel import RUNTIME_ARGS, Arg, Build, Compiled, KernelSpec
from mono_runtime.kernel.registry import register

from ..config import KimiK3Config
from . import triton_build
from .spec import K1Build

DOCS = {
    "prefix": "bf16 [S, H] the AttnRes prefix, updated in place (+ delta)",
    "delta": "bf16 [S, H] the layer before's output (unread without a delta: pass prefix)",
    "blocks": "bf16 [S, blocks, H] AttnRes blocks; a block-write layer stores one",
    "ares_norm": "bf16 [H] AttnRes norm weight",
    "ares_qk": "bf16 [H] AttnRes query weight",
    "in_norm": "bf16 [H] input RMSNorm weight",
    "in_proj": "bf16 [in_proj_rows, H] q|k|v|g|f_a|beta rows of this rank",
    "f_b": "bf16 [P, f_a_dim] the gate's second projection",
    "conv_w": "fp32 [3P, 4] short-convolution weights (q, k, v channels)",
    "a_log": "fp32 [heads] the gate's A_log",
    "dt_bias": "fp32 [P] the gate's bias",
    "o_norm": "bf16 or fp32 [head_dim] gated RMSNorm weight",
    "conv_state": "bf16 [slots, 3P, state_len] vLLM's conv cache, updated in place",
    "state": "fp32 [slots, heads, D, D] recurrent states, updated in place",
    "state_indices": "int32 [R, L] (spec-verify) or [R] state slots; <= 0 is padding",
    "num_accepted": "int32 [R] accepted tokens (spec-verify; plain: unread, pass indices)",
    "out": "bf16 [S, P] o_proj's input",
    "scratch": "uint8 control words and hand-offs (K1Build.scratch_layout)",
    "blocks_row_stride": "blocks' element stride between rows",
    "blocks_block_stride": "blocks' element stride between blocks",
    "conv_slot_stride": "conv_state's element stride between slots",
    "conv_dim_stride": "conv_state's element stride between channels",
    "conv_pos_stride": "conv_state's element stride between window positions",
    "state_slot_stride": "state's element stride between slots",
    "indices_row_stride": "state_indices' element stride between requests",
    "num_blocks": "AttnRes blocks the mix reads",
    "write_idx": "the block a block-write layer stores (0 otherwise)",
    "num_slots": "slots of state (an index past them is padding)",
    "eps": "AttnRes norm epsilon",
    "out_eps": "input RMSNorm epsilon",
    "o_norm_eps": "gated RMSNorm epsilon",
    "lower_bound": "the gate's lower bound",
}
LAYOUTS = {"conv_state": "vLLM's SD conv cache, transposed to [slots, dim, state_len]"}
SPEC = KernelSpec(
    "k1",
    tuple(
        Arg(name, "*" if name == "o_norm" else kind, DOCS[name], LAYOUTS.get(name, ""))
        for name, kind in triton_build.kernel_types().items()
    )
    + (
        Arg("slot", "i32", "the launch's tag slot in the step (0..255)"),
        Arg("final", "i1", "the step's last K1 launch: it ends in the TP fault handshake"),
    )
    + RUNTIME_ARGS,
)
"""K1's launch, triton_build.LAUNCH_ARGS in order (o_norm: bf16 or fp32, a second
specialization)."""


@register
class K1Triton(Build):
    family = "kda"
    backend = "triton"
    targets = ("sm90",)
    key: K1Build

    @classmethod
    def example(cls) -> Build:
        """A TP8 rank of Kimi-K3: 8 rows, a block-write layer."""
        return cls(K1Build.for_step(KimiK3Config(), 8, 1, write_block=True))

    spec = SPEC

    def supports(self, target: str) -> str | None:
        # Triton compiles it for every GPU and runs it in the interpreter
        if self.key.proj_pf and target.startswith("gfx"):
            return "proj_pf: the L2 bulk prefetch is NVIDIA's (cp.async.bulk.prefetch.L2)"
        return None

    def _compile(self, target: str) -> Compiled:
        kernel = triton_build.compile_for(self.key, target)
        return Compiled(target, kernel.metadata.shared, binary=kernel)

    def warm(self, programs: int, **args: Any) -> None:
        """Compile and load (Triton's warmup); nothing on a CPU."""
        self._check(programs, args)
        if args["scratch"].device.type == "cpu":
            return
        b = self.key
        triton_build.k1_kernel.warmup(
            *(args[name] for name in triton_build.LAUNCH_ARGS),
            grid=(programs,),
            **triton_build.constexprs(b, triton_build.offsets(b)),
            num_warps=b.num_warps,
        )

    def launch(self, programs: int, **args: Any) -> None:
        """Values (slots, accepted counts) are KdaRunner's checks.check_args's to check."""
        self._check(programs, args)
        triton_build.launch(self.key, args)

    def _check(self, programs: int, args: dict) -> None:
        if programs != self.key.programs:
            raise ValueError(f"programs={programs}: this build was made for {self.key.programs}")
        self.spec.check(args)
