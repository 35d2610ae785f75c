"""The FFN Triton build under the CPU interpreter: ranks as processes over the host backend."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from mono_peer.testing import child_json, spawn

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
@pytest.mark.parametrize("fmt,widths", [("bf16", [3, 8]), ("mxfp4", [1, 5, 16])])
def test_tp1_widths(fmt, widths):
    """A spread of widths (the interpreter takes seconds a launch; every width 1..16 runs in
    the GPU tier)."""
    (records,) = spawn(check_steps, 1, 220, fmt, widths, 1, env=ENV)
    _check(records)


@pytest.mark.timeout(200)
def test_tp1_fp8_and_final_handshake():
    (records,) = spawn(
        check_steps, 1, 180, "fp8", [4], 2, "cpu", True, "all", (False, True), env=ENV
    )
    _check(records)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,fmt,widths", [(2, "mxfp4", [1, 4]), (4, "bf16", [3])])
def test_tp_ranks_bit_identical(world, fmt, widths):
    results = spawn(check_steps, world, 220, fmt, widths, 7, "cpu", True, "all", (True,), env=ENV)
    for records in results:
        _check(records)
    for i in range(len(widths)):
        outs = [records[i]["out"] for records in results]
        assert all(o.view(torch.int16).equal(outs[0].view(torch.int16)) for o in outs), (
            f"S={widths[i]}: ranks' outputs are not bit-identical"
        )


@pytest.mark.timeout(200)
@pytest.mark.parametrize("experts", ["routed", "shared"])
def test_expert_subsets(experts):
    (records,) = spawn(check_steps, 1, 180, "bf16", [2], 4, "cpu", True, experts, (False,), env=ENV)
    _check(records)


@pytest.mark.timeout(200)
def test_route_ties_to_lower_id_and_nan_last():
    """Equal keys picked in id order and a NaN key last, in both routes (the last router
    item at S = 1, the route stage's items at S = 5), as the reference picks them."""
    (records,) = spawn(
        check_steps, 1, 180, "bf16", [1, 5], 3, "cpu", True, "all", (False,), None, True, env=ENV
    )
    _check(records)


@pytest.mark.timeout(240)
def test_late_rank_faults_every_rank_then_reset():
    results = spawn(fault_then_reset, 2, 220, "bf16", 1, env=ENV)
    for rank, r in enumerate(results):
        assert r["fault"] is not None, f"rank {rank}: no MonoFault after a late rank"
        assert r["poisoned"], f"rank {rank}: the faulted step returned finite outputs"
        assert r["after_reset_err"] < 1e-2, f"rank {rank}: wrong step after reset()"


@pytest.mark.timeout(280)
def test_compiles_for_sm90_and_gfx950():
    (facts,) = spawn(ranks.compile_checks, 1, 260, "mxfp4", 1, True, env={"TRITON_INTERPRET": "0"})
    assert facts["sys_value_store"], "peer pairs are not 64-bit relaxed stores at sys scope"
    assert facts["sys_release_xchg"], "the handshake is not a 64-bit release exchange at sys scope"
    assert facts["globaltimer"], "the bounded waits do not read %globaltimer"
    assert facts["gpu_acquire"], "waits on other programs' items have no gpu-scope acquire"
    # known: the persistent kernel sits at 255 registers; a few hundred bytes spill
    assert facts["spills"] <= 512, f"sm_90 build spills {facts['spills']} bytes"
    assert facts["residency"] is None, facts["residency"]
    assert facts["split_draws"] == [], (
        f"scalar atomics reach their broadcast barrier with warp 0 split: {facts['split_draws']}"
    )
    assert facts["hip_atomics"], "gfx950 build has no global atomics"


REAL_SHAPES = r"""
import json, sys
from mono_kernels_minimax.ffn import triton_build
from mono_kernels_minimax.ffn.bench import rank_config
from mono_kernels_minimax.ffn.spec import FfnBuild
from mono_runtime.compile_check import resources_of
res = resources_of(triton_build.compile_for(FfnBuild(rank_config(), int(sys.argv[1]), 1), "sm90"))
print(json.dumps({"serialized": res.wgmma_serialized, "spills": res.spill_bytes}))
"""


@pytest.mark.timeout(300)
def test_real_shapes_keep_wgmma_pipelined():
    """A TP4 rank's sm_90 build at S = 1 with its up items' gate and up as one tile (pair
    2, the default there): ptxas keeps the wgmma pipelined (as two dot chains at 255
    registers it serializes every wgmma of the kernel: C7515)."""
    facts, _ = child_json(
        ["-c", REAL_SHAPES, "1"], 180, TRITON_INTERPRET="0", MONO_FFN_TILES="pair=2"
    )
    assert not facts["serialized"], facts
    assert facts["spills"] <= 1024, facts


@pytest.mark.timeout(120)
def test_bad_input_raises_before_any_launch():
    (errors,) = spawn(ranks.bad_inputs, 1, 100, env=ENV)
    for arg, message in errors:
        assert message is not None, f"{arg}: accepted"
        assert message.startswith(arg), f"{arg}: the error does not name it: {message}"


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(programs=0), "programs"),
        (dict(programs=-2), "programs"),
        (dict(programs=1.5), "programs"),
        (dict(widths=[2.0]), "widths"),
        (dict(widths=[]), "widths"),
    ],
)
def test_bad_construction_raises_before_allocating(kw, match, monkeypatch):
    """Refused before the MonoRunner (and its peer mapping) exists: nothing to leak."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn import runner as ffn_runner
    from mono_kernels_minimax.formats import WeightFormat

    def no_runner(*a, **k):
        raise AssertionError("MonoRunner built before the arguments were checked")

    from mono_runtime.kernel import mono_layer_runner

    monkeypatch.setattr(mono_layer_runner, "MonoRunner", no_runner)  # where it is built
    with pytest.raises(ValueError, match=match):
        ffn_runner.FfnRunner(
            MiniMaxM3Config.tiny(), WeightFormat.BF16, None, 0, 1, "cpu", **({"widths": [1]} | kw)
        )


def test_timeline_build_stamps_every_item_of_the_launch():
    """A timeline build records one row per ticket of the launch, each in the stage the
    plan puts it in (the interpreter's clock is the poll count: the times are not tested)."""
    (rows,) = spawn(ranks.timeline_rows, 1, 300, env=ENV)
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn.spec import FfnBuild, stage_bounds

    b = FfnBuild(MiniMaxM3Config.tiny(), 2, 1, timeline=True)
    nslots = rows["nslots"]
    bounds = stage_bounds(b, nslots, final=True)
    assert [r["ticket"] for r in rows["items"]] == list(range(bounds[-1][2]))
    for name, lo, hi in bounds:
        got = [r for r in rows["items"] if r["stage"] == name]
        assert len(got) == hi - lo, name
    assert all(r["program"] in (0, 1) for r in rows["items"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rows", [3, 5])
def test_every_item_waits_for_what_the_spec_says(rows):
    """The kernel's waits, item by item, are spec.waits: a missing one passes every
    output check in the interpreter (it runs tickets in order), but on a GPU the producer
    may be late. The route's pair is also read once per program, before its first ticket
    past the static tasks (the slot count): here program 0's, the first routed up item.
    Three rows (one of them padding): every stage has several items; five: the route is
    a stage of its own (tile rr), three items."""
    (r,) = spawn(ranks.kernel_waits, 1, 280, rows, env=ENV)
    seen, want = r["seen"], r["want"]
    assert seen.pop(r["first_routed"]) == [r["route"]], "the slot count is not learnt once"
    assert seen == want
