"""A tagged in-kernel all-reduce of S x H bf16 rows over the runner's peer buffer, with an
optional residual add and RMSNorm; rank-ordered fp32 sums, so every rank gets the same bits.

Used by this package's tests, `mono qualify` and `mono bench allreduce`."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..builds import CompileCache, Resources, target_of
from ..protocol import PEER_HEAD
from .reference import allreduce_reference
from .spec import AllreduceBuild

__all__ = [
    "ARG_TYPES",
    "AllreduceBuild",
    "allreduce",
    "allreduce_reference",
    "constexprs",
    "default_programs",
    "warm",
]

_CACHE = CompileCache()


def default_programs(device: torch.device) -> int:
    """One program per SM on a GPU; two under the interpreter (still a real ticket loop)."""
    if device.type == "cpu":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(
    runner, build: AllreduceBuild, x, residual, weight, slot, peer_offset, scratch_offset
) -> None:
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"allreduce: {what}")

    need(
        x.dim() == 2 and x.dtype == torch.bfloat16 and x.is_contiguous(),
        f"x must be contiguous 2-D bf16, got {tuple(x.shape)} {x.dtype}",
    )
    need(x.device == runner.device, f"x on {x.device}, runner on {runner.device}")
    for name, t, shape in (("residual", residual, x.shape), ("weight", weight, x.shape[1:])):
        if t is not None:
            need(
                t.dtype == torch.bfloat16
                and t.is_contiguous()
                and t.shape == shape
                and t.device == x.device,
                f"{name} must be contiguous bf16 {tuple(shape)}",
            )
    need(0 <= slot < 256, f"slot {slot} outside 0..255")
    need(peer_offset % 8 == 0 and scratch_offset % 8 == 0, "offsets must be multiples of 8")
    data = runner.peer.nbytes - PEER_HEAD
    need(
        peer_offset + build.peer_bytes <= data,
        f"needs {build.peer_bytes} peer bytes at {peer_offset}, runner has {data}",
    )
    need(
        scratch_offset + build.scratch_bytes <= runner.scratch.numel(),
        f"needs {build.scratch_bytes} scratch bytes at {scratch_offset}, "
        f"runner has {runner.scratch.numel()}",
    )


def allreduce(
    runner,
    x: torch.Tensor,
    slot: int = 0,
    residual: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    block: int = 256,
    programs: int | None = None,
    peer_offset: int = 0,
    scratch_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sum `x` (this rank's [S, H] bf16 partial) over the runner's ranks in one launch of
    `slot` of the current step; returns (out, residual_out) as `allreduce_reference` does.
    Every rank must make the same call. Call `runner.step_begin()` once per step first."""
    from .kernel import allreduce_kernel

    build = AllreduceBuild(
        x.shape[0] if x.dim() else 0,
        x.shape[-1] if x.dim() else 0,
        runner.world,
        residual is not None,
        weight is not None,
        block,
    )
    _check(runner, build, x, residual, weight, slot, peer_offset, scratch_offset)
    out = torch.empty_like(x)
    rout = torch.empty_like(x) if residual is not None else None
    as32 = lambda t: t.view(torch.int32)  # noqa: E731  (bf16 pairs as int32 payloads)
    grid = (max(1, min(build.items, programs or default_programs(x.device))),)
    args = runner.launch_args()
    allreduce_kernel[grid](
        as32(x),
        as32(residual if residual is not None else x),
        as32(weight if weight is not None else x[0]),
        as32(out),
        as32(rout if rout is not None else out),
        build.rows,
        build.pairs,
        float(eps),
        slot,
        peer_offset // 8,
        scratch_offset,
        build.rows_region(),
        build.sumsq_region(),
        args["ctl"],
        args["health"],
        args["scratch"],
        args["tickets"],
        runner.peer.addresses,
        runner.rank,
        runner.world,
        **constexprs(build, runner.cpu),
    )
    return out, rout


ARG_TYPES = {
    "x32": "*i32",
    "res32": "*i32",
    "w32": "*i32",
    "out32": "*i32",
    "rout32": "*i32",
    "rows": "i32",
    "pairs": "i32",
    "eps": "fp32",
    "slot": "i32",
    "peer_off": "i64",
    "sumsq_off": "i64",
    "region": "i32",
    "sq_region": "i32",
    "ctl": "*i64",
    "health": "i64",
    "scratch": "*u8",
    "tickets": "*i64",
    "peers": "*i64",
    "rank": "i32",
    "world": "i32",
}
"""The kernel's runtime arguments and their Triton types (for compiles without a GPU)."""


def constexprs(build: AllreduceBuild, cpu: bool = False) -> dict[str, object]:
    return {
        "RESIDUAL": build.residual,
        "NORM": build.norm,
        "BLOCK": build.block,
        "NB": build.blocks,
        "NB_P2": triton_next_pow2(build.blocks),
        "CPU": cpu,
    }


def warm(
    runner,
    widths: Iterable[int],
    hidden: int,
    residual: bool = False,
    norm: bool = False,
    block: int = 256,
) -> dict[AllreduceBuild, Resources | None]:
    """Compile the kernel for every width now (before memory profiling and graph capture),
    launching nothing; the compiled resources on a GPU, None under the interpreter (which
    compiles nothing). Rows, slot and rank are not specialized: one binary per variant."""
    from .kernel import allreduce_kernel

    builds = [AllreduceBuild(w, hidden, runner.world, residual, norm, block) for w in widths]
    if runner.cpu:
        return dict.fromkeys(builds)

    def compile_one(build: AllreduceBuild) -> Resources:
        x = torch.empty(build.rows, build.hidden, dtype=torch.bfloat16, device=runner.device)
        x32, w32 = x.view(torch.int32), x[0].view(torch.int32)
        args = runner.launch_args()
        kernel = allreduce_kernel.warmup(
            x32,
            x32,
            w32,
            x32,
            x32,
            build.rows,
            build.pairs,
            1e-6,
            0,
            0,
            0,
            build.rows_region(),
            build.sumsq_region(),
            args["ctl"],
            args["health"],
            args["scratch"],
            args["tickets"],
            runner.peer.addresses,
            runner.rank,
            runner.world,
            **constexprs(build),
            grid=(1,),
        )
        return Resources.of_compiled(kernel)

    return _CACHE.warm(builds, allreduce_kernel, target_of(runner.device), compile_one)


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
