"""K2Runner: one rank's K2 launches, one build and scratch region per width.

A LayerRunner (mono_runtime.kernel) on a MonoRunner, like KdaRunner and the FFN's runner:
built collectively (every rank of the TP group, same arguments), it owns a MonoRunner
unless given one to share (then its owner closes it, and `scratch_offset` places K2's
regions past what the runner's other kernels use). Epoch scheme: the runtime's:
`step_begin()` bumps the epoch once per forward (graph-capturable) and each launch of the
step takes the next tag slot, which also names its ticket counter; every rank issuing the
same launches derives the same tags. `after_step()` once per executed step raises
MonoFault on every rank after any give-up; `reset()` makes the runner usable again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from mono_runtime.errors import MonoUnsupported
from mono_runtime.kernel import check_tensor, same_device, target_name
from mono_runtime.kernel.mono_layer_runner import MonoLayerRunner
from mono_runtime.runner import DEFAULT_DEADLINE_NS, MonoRunner
from mono_runtime.timeline import from_stamps, read_stamps

from ..config import KimiK3Config
from .build import BY_BACKEND
from .spec import (
    K2Build,
    peer_bytes,
    scratch_bytes,
    scratch_layout,
    stage_of,
    table_offsets,
    tickets,
)
from .weights import K2Weights

BF16 = torch.bfloat16


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _build(cfg: KimiK3Config, s: int, engine: str, pack: bool, timeline: bool) -> K2Build:
    return K2Build(cfg, s, packed=pack, timeline=timeline, frag=engine == "gluon")


def choose_engine(
    cfg: KimiK3Config, widths: Iterable[int], target: str, pack: bool, timeline: bool
) -> str:
    """The build to run: "gluon" where it serves every width on `target` (NVIDIA sm_90+,
    shapes it can lower) and the experts are packed (mxfp4-frag): on the H200 it runs
    1.08x-1.73x the op-by-op path at S = 1-16 where the Triton build runs 0.92x-1.43x
    (docs/PERFORMANCE.md, stop 39); "triton" elsewhere: the interpreter, other GPUs, tiny
    shapes, vLLM's own expert layout."""
    if not pack:
        return "triton"
    gluon = [BY_BACKEND["gluon"](_build(cfg, s, "gluon", pack, timeline)) for s in widths]
    return "gluon" if all(k.supports(target) is None for k in gluon) else "triton"


class K2Runner(MonoLayerRunner):
    def __init__(
        self,
        cfg: KimiK3Config,
        group: Any,
        rank: int,
        device: torch.device | str,
        widths: Iterable[int] = range(1, 17),
        deadline_ns: int = DEFAULT_DEADLINE_NS,
        programs: int | None = None,
        runner: MonoRunner | None = None,
        pack: bool = True,
        timeline: bool = False,
        scratch_offset: int = 0,
        engine: str | None = None,
    ) -> None:
        """`cfg.tp` ranks; `pack`: stream the experts in the build's layout (mxfp4-rot,
        Gluon's mxfp4-frag), which `pack(weights)` converts them to once, in place (False:
        the checkpoint's mxfp4-k32 as loaded).
        `timeline`: builds that stamp each item's program, start, ready and end
        (`timeline(s)`). `engine`: "triton", or "gluon" (the same kernel body compiled by
        Gluon, experts packed as mxfp4-frag; a shape it cannot lower is refused with
        MonoUnsupported, naming why); None: `choose_engine`'s."""
        self.cfg, self.rank, self.tp = cfg, rank, cfg.tp
        self._setup(device, widths, programs, scratch_offset)
        target = target_name(self.device)
        if engine is None:
            engine = choose_engine(cfg, self.widths, target, bool(pack), bool(timeline))
        if engine not in BY_BACKEND:
            raise ValueError(f"engine={engine!r}: expected one of {sorted(BY_BACKEND)}")
        self.build_name = engine
        self.builds = {s: _build(cfg, s, engine, bool(pack), bool(timeline)) for s in self.widths}
        self.kernels = {s: BY_BACKEND[engine](b) for s, b in self.builds.items()}
        for kernel in self.kernels.values():
            reason = kernel.supports(target)
            if reason:
                raise MonoUnsupported(f"K2 runner on {target}: {reason}")
        sizes = {s: scratch_bytes(b) for s, b in self.builds.items()}
        self._attach(
            sizes, peer_bytes(cfg), group, rank, self.tp, deadline_ns, runner, scratch_offset
        )
        if programs is None:
            occ = max(b.plan.occ for b in self.builds.values())  # programs an SM (a tile)
            programs = (
                2
                if self.cpu
                else occ * torch.cuda.get_device_properties(self.device).multi_processor_count
            )
        self.programs = programs
        self._opened()

    def pack(self, weights: K2Weights) -> K2Weights:
        """`weights` in the expert layout this runner streams, converted once, in place;
        call it at load, before any launch."""
        self._live()
        if not isinstance(weights, K2Weights):
            raise ValueError(f"weights: expected K2Weights, got {type(weights).__name__}")
        b = self.builds[self.widths[0]]
        return weights.packed(b.packed and not b.frag, b.frag)

    # -- views ----------------------------------------------------------------------------
    def _layout(self, s: int) -> dict:
        return scratch_layout(self.builds[s])

    def routing(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids int32 [S, K], topk_weights fp32 [S, K]) of width s's last launch."""
        k = self.cfg.num_experts_per_token
        return self._routing(s, k, table_offsets(self.builds[s]))

    def timeline(self, s: int, final: bool = False) -> list[dict]:
        """Width s's last launch (`final`: it ended in the handshake), item by item in
        ticket order: mono_runtime.timeline's rows (stage: spec.stages; times in us of the
        device clock, of poll counts under the interpreter)."""
        self._live()
        b = self.builds[s]
        if not b.timeline:
            raise ValueError("timeline: this runner's builds do not stamp items (timeline=True)")
        stamps = read_stamps(self.region(s, "timeline"), tickets(b, final))
        return from_stamps(stamps, lambda t: stage_of(b, t))

    # -- launches -------------------------------------------------------------------------
    def warm(self) -> None:
        """Compile every width before memory profiling and graph capture; refuse a width
        whose grid cannot be resident (GPU only: the interpreter compiles nothing)."""
        self._live()
        for s, kernel in self.kernels.items():
            kernel.warm(self.programs, **self._args(s, 0, *self._dummies(s)))  # compiles only

    def _dummies(self, s: int):
        c, dev = self.cfg, self.device
        h = c.hidden_size
        core = torch.zeros(s, c.o_proj_in, dtype=BF16, device=dev)
        z = torch.zeros(s, h, dtype=BF16, device=dev)
        blocks = torch.zeros(s, c.num_attn_res_blocks, h, dtype=BF16, device=dev)
        slots = torch.zeros(s, dtype=torch.int64, device=dev)
        made = {
            name: torch.empty(64, dtype=dtype, device=dev)
            for name, (_, dtype) in K2Weights.expected(c).items()
        }
        b = self.builds[s]
        w = K2Weights(**made, rot=b.packed and not b.frag, frag=b.frag)
        return core, z, blocks, z, slots, w

    def _args(
        self,
        s,
        slot,
        core,
        prefix,
        blocks,
        out,
        slots,
        weights,
        sources=0,
        reset=False,
        final=False,
    ) -> dict:
        region = self.scratch(s)
        return dict(
            core=core,
            prefix=prefix,
            blocks=blocks,
            out=out,
            slots=slots,
            weights=weights,
            scratch=region,
            sources=sources,
            reset=reset,
            slot=slot,
            final=final,
            **self.mono.runtime_args(),
        )

    def __call__(
        self,
        core: torch.Tensor,
        prefix: torch.Tensor,
        blocks: torch.Tensor,
        weights: K2Weights,
        slots: torch.Tensor,
        layer_idx: int,
        out: torch.Tensor | None = None,
        final: bool = False,
    ) -> torch.Tensor:
        """One MoE layer on S rows: returns out [S, H] (all-reduced; 0 on padding rows,
        `slots[s] < 0`) and updates `prefix` in place on live rows. `final` ends the launch
        in the TP fault handshake. Bad input raises ValueError before any launch."""
        self._live()
        s, sources, reset = self._check(core, prefix, blocks, weights, slots, layer_idx, out)
        if not isinstance(final, bool):
            raise ValueError(f"final: expected a bool, got {type(final).__name__}")
        if out is None:
            out = torch.empty_like(prefix)
        slot = self.mono.take_slot()  # shared with K1 when both launch into one step
        args = self._args(s, slot, core, prefix, blocks, out, slots, weights, sources, reset, final)
        self.kernels[s].launch(self.programs, **args)
        return out

    def _check(self, core, prefix, blocks, weights, slots, layer_idx, out):
        c = self.cfg
        h = c.hidden_size
        if not isinstance(core, torch.Tensor) or core.dim() != 2:
            raise ValueError(f"core: expected a 2-D tensor [S, {c.o_proj_in}]")
        s = core.shape[0]
        if s not in self.builds:
            raise ValueError(f"core: {s} rows, this runner serves widths {self.widths}")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            raise ValueError(f"layer_idx: expected an int, got {type(layer_idx).__name__}")
        if not 0 <= layer_idx < c.num_hidden_layers:
            raise ValueError(f"layer_idx: {layer_idx} outside 0..{c.num_hidden_layers - 1}")
        sources, reset = c.mlp_attn_res(layer_idx)
        for name, t, shape, dtype in (
            ("core", core, (s, c.o_proj_in), BF16),
            ("prefix", prefix, (s, h), BF16),
            ("slots", slots, (s,), torch.int64),
            ("out", out, (s, h), BF16),
        ):
            if t is not None:
                check_tensor(name, t, shape, dtype, self.device)
        if not isinstance(blocks, torch.Tensor) or blocks.dim() != 3:
            raise ValueError(f"blocks: expected a 3-D tensor [S, blocks, {h}]")
        if blocks.shape[0] != s or blocks.shape[2] != h or blocks.shape[1] < sources:
            raise ValueError(
                f"blocks: shape {tuple(blocks.shape)}, expected [{s}, >= {sources}, {h}]"
            )
        if blocks.dtype != BF16:
            raise ValueError(f"blocks: dtype {blocks.dtype}, expected {BF16}")
        if blocks.stride(2) != 1:
            raise ValueError(f"blocks: columns must be contiguous (strides {blocks.stride()})")
        if not same_device(blocks.device, self.device):
            raise ValueError(f"blocks: on {blocks.device}, expected {self.device}")
        written = [("prefix", prefix)] + ([("out", out)] if out is not None else [])
        for what, w in written:  # outputs must not overlap what the kernel reads
            a, b = _span(w)
            for name, t in (("prefix", prefix), ("core", core), ("blocks", blocks)):
                lo, hi = _span(t)
                if name != what and a < hi and lo < b:
                    raise ValueError(f"{what}: shares memory with {name}")
        if not isinstance(weights, K2Weights):
            raise ValueError(f"weights: expected K2Weights, got {type(weights).__name__}")
        weights.validate(c, self.device)
        want = self.builds[s].layout
        if weights.expert_layout != want:
            packed = weights.rot or weights.frag
            raise ValueError(
                f"weights: experts in {weights.expert_layout}, this runner streams {want}"
                + ("" if packed else ": K2Runner.pack(weights) converts them once")
            )
        return s, sources, reset
