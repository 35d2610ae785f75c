"""Residency and ISA-metadata parsing of FlyDSL builds: pure Python, no FlyDSL needed."""

from __future__ import annotations

import pytest
from mono_runtime.flydsl.isa import Resources, parse_isa
from mono_runtime.flydsl.residency import residency_problem, workgroups_per_cu


def res(vgprs=64, agprs=0, sgprs=40, lds=0, scratch=0, spills=0, sgpr_spills=0, threads=512):
    return Resources(
        vgprs=vgprs,
        agprs=agprs,
        total_vgprs=vgprs + agprs,
        sgprs=sgprs,
        lds_bytes=lds,
        scratch_bytes=scratch,
        vgpr_spills=spills,
        sgpr_spills=sgpr_spills,
        max_threads=threads,
        wave_size=64,
    )


def test_one_workgroup_per_cu_fits_gfx950():
    assert residency_problem(res(vgprs=256), grid=256, threads=512, arch="gfx950") is None


def test_vgprs_limit_workgroups_per_cu():
    # 512 threads = 8 waves = 2 per SIMD; 128 VGPRs -> 4 waves per SIMD -> 2 workgroups
    assert workgroups_per_cu(res(vgprs=128), 512, "gfx950") == (2, "VGPRs")
    # 257 VGPRs (264 allocated) -> 1 wave per SIMD < 2 needed: nothing fits
    n, limit = workgroups_per_cu(res(vgprs=257), 512, "gfx950")
    assert (n, limit) == (0, "VGPRs")
    why = residency_problem(res(vgprs=257), grid=256, threads=512, arch="gfx950")
    assert "cannot be resident" in why and "VGPRs" in why


def test_lds_limits_and_differs_by_arch():
    big = res(vgprs=32, lds=100 * 1024)
    assert workgroups_per_cu(big, 256, "gfx950") == (1, "LDS")
    assert workgroups_per_cu(big, 256, "gfx942") == (0, "LDS")
    assert "LDS" in residency_problem(big, grid=256, threads=256, arch="gfx942")


def test_grid_larger_than_cus_times_occupancy_is_refused():
    why = residency_problem(res(vgprs=257), grid=512, threads=256, arch="gfx950", cus=256)
    assert why is not None and "512 workgroups" in why
    assert residency_problem(res(vgprs=128), grid=512, threads=256, arch="gfx950") is None


def test_spills_to_scratch_are_refused():
    assert "spills" in residency_problem(res(scratch=16), 256, 512, "gfx950")
    assert "spills" in residency_problem(res(spills=3), 256, 512, "gfx950")
    # SGPRs spilled into VGPR lanes touch no memory
    assert residency_problem(res(sgpr_spills=40), 256, 512, "gfx950") is None


def test_unknown_arch_is_refused():
    assert "no residency model" in residency_problem(res(), 1, 64, "gfx90a")


ISA = """\t.amdgcn_target "amdgcn-amd-amdhsa-unknown-gfx950"
k:
\ts_load_dword s4, s[0:1], 0x8 ; comment
\tglobal_store_dwordx2 v4, v[0:1], s[2:3] sc0 sc1
\ts_endpgm
.Lfunc_end0:
\t.amdhsa_next_free_vgpr 12
\t.amdhsa_accum_offset 8
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .offset:         0
        .size:           8
        .value_kind:     by_value
      - .offset:         8
        .size:           4
        .value_kind:     by_value
    .group_segment_fixed_size: 1024
    .max_flat_workgroup_size: 256
    .name:           k
    .private_segment_fixed_size: 0
    .reqd_workgroup_size:
      - 256
      - 1
      - 1
    .sgpr_count:     14
    .sgpr_spill_count: 0
    .vgpr_count:     5
    .vgpr_spill_count: 0
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa-unknown-gfx950
amdhsa.version:
  - 1
  - 2
...
\t.end_amdgpu_metadata
"""


def test_parse_isa_reads_metadata_args_and_body():
    isa = parse_isa(ISA)
    assert isa.name == "k" and isa.arch == "gfx950"
    r = isa.resources
    assert (r.vgprs, r.agprs, r.total_vgprs, r.sgprs, r.lds_bytes) == (5, 4, 12, 14, 1024)
    assert not r.spills
    assert [(a.offset, a.size) for a in isa.args] == [(0, 8), (8, 4)]
    assert isa.body == (
        "s_load_dword s4, s[0:1], 0x8",
        "global_store_dwordx2 v4, v[0:1], s[2:3] sc0 sc1",
        "s_endpgm",
    )
    assert isa.count(r"sc0 sc1") == 1


def test_parse_isa_refuses_text_without_metadata():
    with pytest.raises(ValueError, match="metadata"):
        parse_isa("k:\n s_endpgm\n")
