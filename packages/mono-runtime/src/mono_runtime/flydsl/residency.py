"""Whether a persistent grid can be resident at once on a CDNA GPU, from the resources in
its code object (no GPU needed; the driver's occupancy query agrees for these limits).

A persistent kernel whose programs wait on each other needs every program of its grid on
a CU at the same time (a ticket loop only needs progress, but a grid that is not resident
serializes and misses its deadlines), so a build whose grid does not fit is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import Resources


@dataclass(frozen=True)
class CdnaTarget:
    """Per-CU limits of one CDNA generation (wave64)."""

    arch: str
    cus: int  # of the full part (MI355X, MI300X)
    simds: int = 4
    vgprs_per_simd: int = 512  # unified VGPR + AGPR file, per lane
    vgpr_granule: int = 8
    sgprs_per_simd: int = 800
    sgpr_granule: int = 16
    waves_per_simd: int = 8
    lds_bytes: int = 65536
    lds_granule: int = 512
    workgroups_per_cu: int = 32


TARGETS = {
    "gfx950": CdnaTarget("gfx950", cus=256, lds_bytes=160 * 1024),
    "gfx942": CdnaTarget("gfx942", cus=304, lds_bytes=64 * 1024),
}


def _up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def workgroups_per_cu(res: Resources, threads: int, arch: str) -> tuple[int, str]:
    """(resident workgroups per CU, the resource that limits it)."""
    t = TARGETS[arch]
    if threads > res.max_threads > 0:
        return 0, f"{threads} threads > the kernel's maximum workgroup size {res.max_threads}"
    waves = -(-threads // res.wave_size)
    per_simd = -(-waves // t.simds)  # a workgroup's waves spread over the SIMDs
    limits = {
        "waves": t.waves_per_simd,
        "VGPRs": t.vgprs_per_simd // max(_up(res.total_vgprs, t.vgpr_granule), t.vgpr_granule),
        "SGPRs": t.sgprs_per_simd // max(_up(res.sgprs + 6, t.sgpr_granule), t.sgpr_granule),
    }
    by = {name: lim // per_simd for name, lim in limits.items()}
    lds = _up(res.lds_bytes, t.lds_granule)
    by["LDS"] = t.lds_bytes // lds if lds else t.workgroups_per_cu
    by["workgroup slots"] = t.workgroups_per_cu
    limit = min(by, key=by.get)  # type: ignore[arg-type]
    return by[limit], limit


def residency_problem(
    res: Resources, grid: int, threads: int, arch: str, cus: int | None = None
) -> str | None:
    """None when ``grid`` workgroups of ``threads`` fit at once on ``cus`` CUs of ``arch``
    (default: the full part), else why not, in words a person can act on."""
    if arch not in TARGETS:
        return f"no residency model for {arch!r} (known: {', '.join(TARGETS)})"
    cus = TARGETS[arch].cus if cus is None else cus
    if res.spills:
        return (
            f"the kernel spills to scratch ({res.vgpr_spills} VGPR spills, "
            f"{res.scratch_bytes} B scratch per lane)"
        )
    per_cu, limit = workgroups_per_cu(res, threads, arch)
    if per_cu * cus < grid:
        return (
            f"{grid} workgroups of {threads} threads cannot be resident on {cus} CUs of {arch}: "
            f"{per_cu} per CU, limited by {limit} ({res.total_vgprs} VGPRs, {res.sgprs} SGPRs, "
            f"{res.lds_bytes} B LDS per workgroup)"
        )
    return None
