"""FfnRunner: one rank's FFN monokernels, one compiled build and scratch region per width.

Built collectively (every rank of the TP group, same arguments): it owns a MonoRunner
(control words, health, peer buffer) unless given one to share (then its owner closes
it). A LayerRunner (mono_runtime.kernel): every method raises after `close()`. Epoch
scheme: the runtime's (PROTOCOL.md): `step_begin()` bumps the shared epoch once per
forward (graph-capturable) and each launch of the step takes the next tag slot, which
also names its ticket counter; every rank issuing the same launches derives the same
tags. Call `after_step()` once per executed step (it raises MonoFault on every rank after
any give-up).

Build: `choose_build` picks FlyDSL on a ROCm GPU, Gluon for packed MXFP4 or FP8 experts
on an NVIDIA GPU of sm_90 or later, and Triton elsewhere (bf16, unpacked experts, other
GPUs, the CPU interpreter); all read the same spec, so the runner's API and arguments are
the same.
Each width's build is a mono_runtime Build (ffn.build): the runner warms and launches
through it, and it refuses, with the reason, a target it does not serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch
from mono_runtime.errors import MonoUnsupported
from mono_runtime.kernel import check_tensor, target_name
from mono_runtime.kernel.mono_layer_runner import MonoLayerRunner
from mono_runtime.runner import MonoRunner
from torch._subclasses.fake_tensor import FakeTensor

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from .build import BY_BACKEND
from .spec import Experts, FfnBuild, peer_bytes, scratch_bytes, scratch_layout, table_offsets
from .weights import FfnWeights


def _no_alias(tensors: dict[str, torch.Tensor | None]) -> None:
    """Refuse an output that shares memory with another argument (residual_out may alias
    residual: the seam reads each element before it writes it)."""
    spans = {
        n: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for n, t in tensors.items()
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
    }
    for out in ("out", "residual_out"):
        if out not in spans:
            continue
        a, b = spans[out]
        for other, (lo, hi) in spans.items():
            if other != out and (out, other) != ("residual_out", "residual") and a < hi and lo < b:
                raise ValueError(f"{out}: shares memory with {other}")


def choose_build(
    device: torch.device | str,
    hip_version: str | None,
    fmt: WeightFormat | None = None,
    pack: bool = True,
    arch: int = 0,
) -> str:
    """ "flydsl" on a GPU of a ROCm torch (`torch.version.hip` set); "gluon" for packed
    MXFP4 or FP8 experts on an NVIDIA GPU of compute capability `arch` >= 90 (its mma.sync
    engine streams them 1.3-1.6x (MXFP4) and 1.25-1.41x (FP8, H100, stop 41) faster than
    the Triton build: docs/PERFORMANCE.md); "triton" elsewhere: bf16, unpacked weights
    (vLLM's own tensors), other GPUs, and the interpreter on a CPU."""
    if torch.device(device).type != "cuda":
        return "triton"
    if hip_version:
        return "flydsl"
    packed = fmt in (WeightFormat.MXFP4, WeightFormat.FP8) and pack
    return "gluon" if packed and arch >= 90 else "triton"


def _arch(device: torch.device) -> int:
    """The compute capability of an NVIDIA `device` as 90 for 9.0; 0 where there is none to
    ask (a CPU, a torch without a driver)."""
    if device.type != "cuda" or torch.version.hip:
        return 0
    try:
        major, minor = torch.cuda.get_device_capability(device)
    except (RuntimeError, AssertionError):
        return 0
    return 10 * major + minor


class FfnRunner(MonoLayerRunner):
    def __init__(
        self,
        cfg: MiniMaxM3Config,
        fmt: WeightFormat,
        group: Any,
        rank: int,
        tp: int,
        device: torch.device | str,
        widths: Iterable[int] = range(1, 17),
        experts: Experts = Experts.ALL,
        deadline_ns: int = 5_000_000_000,
        programs: int | None = None,
        runner: MonoRunner | None = None,
        pack: bool = True,
        timeline: bool = False,
        engine: str | None = None,
    ) -> None:
        """`pack`: MXFP4 experts are streamed in the build's packed layout (mxfp4-rot, or
        mxfp4-frag for Gluon), FP8 ones by the Gluon build in fp8-frag, which
        `pack(weights)` converts them to once, in place; False streams the checkpoint's
        layout as it is (slower; for an engine whose other paths read those tensors).
        `timeline`: builds that stamp each item's start, ready and end (`timeline(s)`).
        `engine`: the build ("triton", "gluon": MXFP4 or FP8 in their frag layouts,
        "flydsl"); None picks by device (`choose_build`)."""
        self.cfg, self.fmt, self.tp, self.rank = cfg, WeightFormat(fmt), tp, rank
        self._setup(device, widths, programs)
        self.build_name = engine or choose_build(
            self.device, torch.version.hip, self.fmt, bool(pack), _arch(self.device)
        )
        if self.build_name not in BY_BACKEND:
            raise ValueError(f"engine={engine!r}: expected one of {sorted(BY_BACKEND)} or None")
        frag = self.build_name == "gluon"
        self.builds = {
            s: FfnBuild(
                cfg,
                s,
                tp,
                self.fmt,
                Experts(experts),
                packed=bool(pack),
                timeline=bool(timeline),
                frag=frag,
            )  # fmt: skip
            for s in self.widths
        }
        target = target_name(self.device)
        if (
            engine is None
            and frag
            and any(BY_BACKEND["gluon"](b).supports(target) for b in self.builds.values())
        ):  # a shape the Gluon build cannot serve: the Triton build's layout
            self.build_name, frag = "triton", False
            self.builds = {s: replace(b, frag=False) for s, b in self.builds.items()}
        self.kernels = {s: BY_BACKEND[self.build_name](b) for s, b in self.builds.items()}
        for kernel in self.kernels.values():
            reason = kernel.supports(target)
            if reason:
                raise MonoUnsupported(f"FFN runner on {target}: {reason}")
        sizes = {s: scratch_bytes(b) for s, b in self.builds.items()}
        self._attach(sizes, peer_bytes(cfg, tp), group, rank, tp, deadline_ns, runner)
        if programs is None and self.cpu:
            programs = 2
        elif programs is None:  # the plans' `occ` programs per SM (ticket loops need no
            # residency: a grid larger than fits runs in waves, correctly)
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            programs = sms * max(b.plan.occ for b in self.builds.values())
        self.programs = programs
        # the expert layout the build streams: mxfp4-rot for the Triton build's MXFP4,
        # mxfp4-frag / fp8-frag for the Gluon build's
        self.rot = self.build_name != "flydsl" and self.builds[self.widths[0]].rot
        self.frag = frag
        self._opened()

    def pack(self, weights: FfnWeights) -> FfnWeights:
        """`weights` in the expert layout this runner streams, converted once, in place (the
        engine's tensors are rewritten, not copied); call it at load, before any launch.
        A bundle already in that layout comes back as it is."""
        self._live()
        if not isinstance(weights, FfnWeights):
            raise ValueError(f"weights: expected FfnWeights, got {type(weights).__name__}")
        return weights.packed(self.rot, self.frag)

    # -- views ----------------------------------------------------------------------------
    def _layout(self, s: int) -> dict:
        return scratch_layout(self.builds[s])

    def routing(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids int32 [S, K], topk_weights fp32 [S, K]) of width s's last launch."""
        return self._routing(s, self.cfg.top_k, table_offsets(self.builds[s]))

    def timeline(self, s: int, final: bool = False) -> list[dict]:
        """Width s's last launch, item by item (timeline builds only; see ffn.timeline)."""
        from .timeline import items

        b = self.builds[s]
        if not b.timeline:
            raise ValueError(
                "timeline: this runner's builds do not stamp items (FfnRunner(timeline=True))"
            )
        nslots = int(self.region(s, "table")[:4].view(torch.int32)[0])
        return items(self.region(s, "timeline"), b, nslots, final)

    # -- launches -------------------------------------------------------------------------
    def warm(self) -> None:
        """Compile every width before memory profiling and graph capture, and refuse a
        width whose grid cannot be resident at once (GPU only; the interpreter compiles
        nothing). The FlyDSL build compiles in child processes here for the residency
        check; its first launch of a width loads that width (flydsl_build.launch)."""
        self._live()
        launches = [(k, self._args(k.key, s, *self._dummies(s))) for s, k in self.kernels.items()]
        BY_BACKEND[self.build_name].warm_all(launches, self.programs)

    def _dummies(self, s: int):
        h = self.cfg.hidden_size
        z = torch.zeros(s, h, dtype=torch.bfloat16, device=self.device)
        return z, z, z, z, torch.zeros(s, dtype=torch.int64, device=self.device)

    def _args(
        self, b, s, part, residual, out, residual_out, slots, weights=None, slot=0, final=False
    ) -> dict:
        """The launch's arguments by name: the `kernel_args` keywords of either build."""
        region = self.scratch(s)
        if weights is None:
            weights = self._type_weights()
        return dict(
            part=part,
            residual=residual,
            out=out,
            residual_out=residual_out,
            slots=slots,
            weights=weights,
            scratch=region,
            slot=slot,
            final=final,
            **self.mono.runtime_args(),
        )

    def _type_weights(self) -> FfnWeights:
        """Placeholder tensors of the right dtypes: what a compile without a launch needs."""
        fmt = self.fmt
        spec = FfnWeights(fmt, *([None] * 11)).expected(self.cfg, self.tp)
        made = {
            name: None if dtype is None else torch.empty(64, dtype=dtype, device=self.device)
            for name, (_, dtype) in spec.items()
        }
        return FfnWeights(fmt, **made, rot=self.rot, frag=self.frag)

    def __call__(
        self,
        part: torch.Tensor,
        residual: torch.Tensor,
        weights: FfnWeights,
        slots: torch.Tensor,
        final: bool = False,
        out: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's FFN tail on S rows: (all-reduced MoE output, new residual).
        `slots[s] < 0` marks a padding row (seam only, zero MoE output). `final` ends the
        launch in the TP fault handshake. Bad input raises ValueError before any launch."""
        self._live()
        s = self._check(part, residual, weights, slots, out, residual_out)
        if out is None:
            out = torch.empty_like(part)
        if residual_out is None:
            residual_out = torch.empty_like(residual)
        b, slot = self.builds[s], self.mono.take_slot()
        args = self._args(b, s, part, residual, out, residual_out, slots, weights, slot, final)
        self.kernels[s].launch(self.programs, **args)
        return out, residual_out

    def _check(self, part, residual, weights, slots, out, residual_out) -> int:
        h = self.cfg.hidden_size
        if not isinstance(part, torch.Tensor) or part.dim() != 2:
            raise ValueError(f"part: expected a 2-D tensor [S, {h}]")
        s = part.shape[0]
        if s not in self.builds:
            raise ValueError(f"part: {s} rows, this runner serves widths {self.widths}")
        for name, t, shape, dtype in (
            ("part", part, (s, h), torch.bfloat16),
            ("residual", residual, (s, h), torch.bfloat16),
            ("slots", slots, (s,), torch.int64),
            ("out", out, (s, h), torch.bfloat16),
            ("residual_out", residual_out, (s, h), torch.bfloat16),
        ):
            if t is None and name in ("out", "residual_out"):
                continue
            check_tensor(name, t, shape, dtype, self.device)
        _no_alias(
            {
                "part": part,
                "residual": residual,
                "slots": slots,
                "out": out,
                "residual_out": residual_out,
            }
        )
        if not isinstance(weights, FfnWeights):
            raise ValueError(f"weights: expected FfnWeights, got {type(weights).__name__}")
        if weights.fmt != self.fmt:
            raise ValueError(
                f"weights: format {weights.fmt.value}, this runner reads {self.fmt.value}"
            )
        weights.validate(self.cfg, self.tp, self.device)
        want = replace(weights, rot=self.rot, frag=self.frag).expert_layout
        if weights.expert_layout != want:
            packed = weights.rot or weights.frag
            raise ValueError(
                f"weights: experts in {weights.expert_layout}, this runner streams {want}"
                + ("" if packed else ": FfnRunner.pack(weights) converts them once")
            )
        return s
