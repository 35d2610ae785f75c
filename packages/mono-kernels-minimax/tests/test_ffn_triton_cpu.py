"""The FFN Triton build under the CPU interpreter: ranks as processes over the host backend."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}


def _load(name):
    """A helper module of this folder, loaded by path (children re-load it the same way)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("ffn_ranks")
check_steps, fault_then_reset = ranks.check_steps, ranks.fault_then_reset


def _check(records, world_results=None):
    for r in records:
        where = f"S={r['s']} final={r['final']}"
        assert r["ids_equal"], f"{where}: expert choice differs from the reference"
        assert r["w_err"] < 1e-5, f"{where}: routing weights off by {r['w_err']}"
        assert r["res_err"] < 1e-6, f"{where}: residual rel-L2 {r['res_err']}"
        assert r["out_err"] < 1e-2, f"{where}: out rel-L2 {r['out_err']}"
        assert r["pad_zero"], f"{where}: a padding row got a non-zero MoE output"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt,widths", [
    ("bf16", [1, 3, 5, 7, 9, 11, 13, 15]),
    ("mxfp4", [2, 4, 6, 8, 10, 12, 14, 16]),
])
def test_tp1_every_width(fmt, widths):
    (records,) = spawn(check_steps, 1, 220, fmt, widths, 1, env=ENV)
    _check(records)


@pytest.mark.timeout(200)
def test_tp1_fp8_and_final_handshake():
    (records,) = spawn(check_steps, 1, 180, "fp8", [3], 2, "cpu", True, "all", (False, True),
                       env=ENV)
    _check(records)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,fmt,widths", [(2, "mxfp4", [1, 4]), (4, "mxfp4", [3])])
def test_tp_ranks_bit_identical(world, fmt, widths):
    results = spawn(check_steps, world, 220, fmt, widths, 7, "cpu", True, "all", (True,),
                    env=ENV)
    for records in results:
        _check(records)
    for i in range(len(widths)):
        outs = [records[i]["out"] for records in results]
        assert all(o.view(torch.int16).equal(outs[0].view(torch.int16)) for o in outs), \
            f"S={widths[i]}: ranks' outputs are not bit-identical"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("experts", ["routed", "shared"])
def test_expert_subsets(experts):
    (records,) = spawn(check_steps, 1, 180, "bf16", [2], 4, "cpu", True, experts, (False,),
                       env=ENV)
    _check(records)


@pytest.mark.timeout(240)
def test_late_rank_faults_every_rank_then_reset():
    results = spawn(fault_then_reset, 2, 220, "bf16", 1, env=ENV)
    for rank, r in enumerate(results):
        assert r["fault"] is not None, f"rank {rank}: no MonoFault after a late rank"
        assert r["poisoned"], f"rank {rank}: the faulted step returned finite outputs"
        assert r["after_reset_err"] < 1e-2, f"rank {rank}: wrong step after reset()"

