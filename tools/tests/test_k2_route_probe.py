"""tools/k2_route_probe.py's kernels compile for sm_90 under Gluon, as K2's build does (the
probe itself needs a GPU: part `k2prof` of tools/gpu_session.sh runs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _probe():
    spec = importlib.util.spec_from_file_location(
        "k2_route_probe", Path(__file__).resolve().parents[1] / "k2_route_probe.py"
    )
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


@pytest.mark.timeout(60)
def test_an_unknown_neighbour_is_refused_before_any_launch(capsys):
    with pytest.raises(SystemExit) as e:
        _probe().main(["--neighbours", "none,gemx"])
    assert e.value.code == 2
    assert (
        "--neighbours gemx: each must be one of none, gemv, gemm, copy" in capsys.readouterr().err
    )


@pytest.mark.timeout(240)
def test_probe_kernels_compile_for_sm90():
    probe = _probe()
    from mono_runtime.compile_check import compile_for
    from triton.experimental import gluon

    route = compile_for(
        gluon.jit(probe._route_kernel.fn),
        {"logits": "*fp32", "bias": "*fp32", "ids_out": "*i32", "w_out": "*fp32", "ns": "*i64"},
        {"REPS": 2},
        num_warps=4,
    )
    layout = dict(T_SLOTE=64, T_WTAB=4160, T_IDS=20544, T_TOPW=21568)
    union = compile_for(
        gluon.jit(probe._union_kernel.fn),
        {"scratch": "*u8", "ns": "*i64"},
        dict(S=16, MAXSLOTS=256, SK2=256, WT2=4096, **layout),
        num_warps=4,
    )
    for k in (route, union):
        assert "globaltimer" in k.asm["ptx"]  # the clock it reads around the work
