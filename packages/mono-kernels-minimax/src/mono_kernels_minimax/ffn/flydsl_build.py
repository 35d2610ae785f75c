"""FlyDSL build of the FFN monokernel (AMD gfx950, MI355X; gfx942 compiles too).

The FFN of triton_build.py's first plan, from the same spec (spec.py): the same build key,
scratch and peer layouts, argument list, tags and health records (through
mono_runtime.flydsl.protocol, the FlyDSL twin of the Triton helpers). It has not moved to
the Triton build's streaming plan (split-K up items, per-slot hand-offs, grouped down
items, mxfp4-rot weights): its tickets are push, seam, router, route, then NC up tasks
per slot (IC = the plan's BN rows over all of K), ND down tasks over every slot, final,
handshake; its MXFP4 experts stay in the checkpoint's mxfp4-k32 layout (FfnRunner.pack
leaves them). A grid of GRID programs of THREADS lanes draws tickets.

Work per lane, no matrix cores: a lane owns (row, k-lane) or (column, k-lane) cells, sums
its k-blocks in fp32 and the k-lanes meet in a butterfly. Weights are read once a launch
(an up task reads its IC gate + IC up rows, a down task its DC rows of every slot), which
is what bounds a decode step; matrix-core tiles are a later optimisation.

Weights: ``bf16`` and ``mxfp4-k32`` (formats.py); ``fp8-b128`` is refused here (the Triton
build reads it). Every compile runs in a child process (``compile_isa``): a FlyDSL compile
can abort its process.

No ``from __future__ import annotations``: FlyDSL reads kernel annotations at trace time.
"""

import dataclasses

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from .spec import ARGS, Experts, FfnBuild, peer_layout, scratch_layout, table_offsets

THREADS = 256
WAVE = 64
WAVES = THREADS // WAVE
GRID = 256  # programs of a launch by default: one per CU of an MI355X
MX = 32  # k of an MXFP4 block (one e8m0 scale)
UP_KLANES = 16  # lanes that split the k of one up row
DOWN_KLANES = 8  # lanes that split the k of one down column

# the launch's arguments after spec.ARGS: mono_runtime's launch_args() then peer_args()
# (the names and order of triton_build.ffn_kernel's runtime parameters; tests compare)
RUNTIME_ARGS = ("ctl", "health", "tickets", "peers", "rank", "world")
ARG_NAMES = tuple(name for name, _ in ARGS) + RUNTIME_ARGS
INT32_ARGS = ("slot", "final", "rank", "world")  # every other one is an address (int64)

# wait sites, named in health records (the Triton build's names: the timeline reads alike)
REGION_NAMES = ("ar1", "ar2", "items", "handshake")


class FlyDslUnsupported(ValueError):
    """A build the FlyDSL kernel does not serve (named in the message)."""


def check_build(b: FfnBuild) -> None:
    """Refuse, before any compile, what this build does not serve."""
    if b.weights is WeightFormat.FP8:
        raise FlyDslUnsupported(
            "FlyDSL FFN build reads bf16 and mxfp4-k32 experts; fp8-b128 is served by the "
            "Triton build only"
        )
    if b.rows * 16 > THREADS:
        raise FlyDslUnsupported(f"rows={b.rows}: a router task maps 16 experts x rows lanes")
    if b.inter % MX or b.cfg.hidden_size % MX:
        raise FlyDslUnsupported(
            f"hidden and per-rank intermediate sizes must be multiples of {MX} (a k-block)"
        )


def kernel_name(b: FfnBuild, programs: int = GRID) -> str:
    c = b.cfg
    name = (
        f"mono_ffn_h{c.hidden_size}_e{c.num_experts}_i{b.inter}_s{b.rows}_tp{b.tp}"
        f"_{b.weights.value}_p{programs}"
    )
    return name if b.experts is Experts.ALL else f"{name}_{b.experts.value}"


def job_kwargs(b: FfnBuild, programs: int = GRID) -> dict:
    """JSON-able arguments of ``build_job`` for build ``b`` (the compile child rebuilds it)."""
    return {
        "cfg": dataclasses.asdict(b.cfg),
        "rows": b.rows,
        "tp": b.tp,
        "weights": b.weights.value,
        "experts": b.experts.value,
        "programs": programs,
    }


def build_job(cfg: dict, rows: int, tp: int, weights: str, experts: str, programs: int):
    """``mono_runtime.flydsl.offline`` builder: (launcher, example arguments)."""
    b = FfnBuild(MiniMaxM3Config(**cfg), rows, tp, WeightFormat(weights), Experts(experts))
    return build(b, programs), tuple(0 for _ in ARG_NAMES)


def compile_isa(builds, arch: str = "gfx950", programs: int = GRID, processes: int | None = None):
    """Compile every build in child processes; their ISA (``mono_runtime.flydsl.isa``)."""
    from mono_runtime.flydsl.offline import Job, compile_all

    for b in builds:
        check_build(b)
    jobs = [Job(f"{__name__}:build_job", job_kwargs(b, programs)) for b in builds]
    return compile_all(jobs, arch, processes=processes)


def check_resident(
    builds, arch: str = "gfx950", programs: int = GRID, cus: int | None = None
) -> None:
    """Compile ``builds`` (child processes) and raise MonoUnsupported naming every build
    whose grid cannot be resident on ``cus`` CUs of ``arch`` (warm-up, before any launch)."""
    from mono_runtime.errors import MonoUnsupported

    problems = [
        f"{kernel_name(b, programs)}: {why}"
        for b, isa in zip(builds, compile_isa(builds, arch, programs), strict=True)
        if (why := residency_problem(isa, programs, cus))
    ]
    if problems:
        raise MonoUnsupported("FlyDSL FFN builds refused:\n  " + "\n  ".join(problems))


def residency_problem(isa, programs: int = GRID, cus: int | None = None) -> str | None:
    """Why a compiled build's grid cannot be resident on ``cus`` CUs (default: the full
    part of its target), or None when it can."""
    from mono_runtime.flydsl.residency import residency_problem as problem

    return problem(isa.resources, programs, THREADS, isa.arch, cus)


def build(b: FfnBuild, programs: int = GRID):
    """The ``flyc.jit`` launcher of build ``b`` for a grid of ``programs`` (arguments:
    ARG_NAMES, then ``stream``)."""
    check_build(b)
    try:
        from . import flydsl_kernel
    except ImportError as err:
        raise FlyDslUnsupported(
            f"FlyDSL is not installed ({err}): the FlyDSL FFN build needs it"
        ) from err
    return flydsl_kernel.make_launcher(b, programs, consts(b))


_LAUNCHERS: dict = {}


def kernel_args(
    *,
    part,
    residual,
    out,
    residual_out,
    slots,
    weights,
    scratch,
    slot,
    final,
    ctl,
    health,
    tickets,
    peers,
    rank,
    world,
) -> list:
    """The launch's arguments in ARG_NAMES order: tensors as device addresses (bf16
    activations and the norm weight are read as bf16 pairs), a missing scale as the scratch
    address (never read), then the int32 scalars. An int is already an address (the
    runner's health words may be pinned host memory, handed over as one)."""
    w = weights

    def addr(t):
        if isinstance(t, int):
            return t
        return (scratch if t is None else t).data_ptr()

    return [
        addr(part),
        addr(residual),
        addr(out),
        addr(residual_out),
        addr(slots),
        addr(w.norm),
        addr(w.router),
        addr(w.bias),
        addr(w.w13),
        addr(w.w13_scale),
        addr(w.w2),
        addr(w.w2_scale),
        addr(w.shared_w13),
        addr(w.shared_w13_scale),
        addr(w.shared_w2),
        addr(w.shared_w2_scale),
        addr(scratch),
        int(slot),
        int(final),
        addr(ctl),
        addr(health),
        addr(tickets),
        addr(peers),
        int(rank),
        int(world),
    ]


def launch(b: FfnBuild, programs: int = GRID, **args) -> None:
    """Launch build ``b`` (compiled on first use, then cached) on already-validated tensors
    on the current stream; ``args`` as ``kernel_args``. ROCm only."""
    if int(args["world"]) != b.tp:
        raise ValueError(f"world={args['world']}: this build was compiled for tp={b.tp}")
    key = (b, programs)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = build(b, programs)
    _LAUNCHERS[key](*kernel_args(**args))


def consts(b: FfnBuild) -> dict:
    """Every number the kernel bakes in: the spec's plan and layouts."""
    c, p = b.cfg, b.plan
    sl, tb, pl = scratch_layout(b), table_offsets(b), peer_layout(c, b.tp)
    return dict(
        S=b.rows,
        H=c.hidden_size,
        E=c.num_experts,
        K=c.top_k,
        I=b.inter,
        W=b.tp,
        MXFP4=b.weights is WeightFormat.MXFP4,
        SHARED=b.experts is not Experts.ROUTED,
        ROUTED=b.experts is not Experts.SHARED,
        MAXSLOTS=b.max_slots,
        NPUSH=p.push,
        PUSHC=p.push_cols,
        SC=p.seam_cols,
        RG=p.router_groups,
        RP=p.router_parts,
        RK=p.router_k,
        NC=p.nc,
        IC=p.bn,
        ND=p.down,
        DC=p.dc,
        NF=p.final,
        FC=p.fc,
        O={k: v[0] for k, v in sl.items()},
        T=tb,
        PL={k: v[0] for k, v in pl.items()},
        ALPHA=c.swiglu_alpha,
        BETA=c.swiglu_beta,
        LIMIT=c.swiglu_limit,
        EPS=c.rms_norm_eps,
        RSF=c.routed_scaling_factor,
    )
