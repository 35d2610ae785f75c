"""K2's Triton build under the CPU interpreter: ranks as processes over the host backend,
against k2_reference (tiny shapes: the interpreter takes seconds a launch; every width
runs in the GPU tier)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from mono_peer.testing import spawn

ENV = {"TRITON_INTERPRET": "1"}
# tiny: layer 2 writes a block (prefix restarts at o), layer 3 adds o to the prefix; a
# step launches both (two tag slots over the same peer regions)
LAYERS = (2, 3)


def _load(name):
    """A helper module of this folder, loaded by path (children re-load it the same way)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("k2_ranks")


def _check(records):
    for r in records:
        where = f"S={r['s']} layer={r['layer']}"
        if "ids_equal" in r:  # the step's last launch leaves its routing in scratch
            assert r["ids_equal"], f"{where}: expert choice differs from the reference"
            assert r["w_err"] < 1e-5, f"{where}: routing weights off by {r['w_err']}"
        assert r["out_err"] < 1e-2, f"{where}: out rel-L2 {r['out_err']}"
        assert r["prefix_err"] < 1e-2, f"{where}: prefix rel-L2 {r['prefix_err']}"
        assert r["pad_untouched"], f"{where}: a padding row's prefix was written"
        assert r["pad_zero"], f"{where}: a padding row got a non-zero output"


@pytest.mark.timeout(200)
def test_tp1_widths_and_layers():
    """Widths 1, 3 and 16 (16 rows x 4 picks: the union counts its slots over two chunks
    of 32 picks)."""
    (records,) = spawn(ranks.check_steps, 1, 180, [1, 3, 16], LAYERS, 0, True, True, env=ENV)
    _check(records)
    # timeline builds: the last launch of each step stamped every ticket, in its stage
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.k2.spec import K2Build, stages

    for r in records[1::2]:
        b = K2Build(KimiK3Config.tiny(1), r["s"], timeline=True)
        rows = r["timeline"]
        assert [row["ticket"] for row in rows] == list(range(len(rows)))
        assert [row["stage"] for row in rows] == [n for n, k in stages(b) for _ in range(k)]
        assert all(row["program"] in (0, 1) for row in rows)
        # the stages that mark a point inside their work, and only they
        marked = {row["stage"] for row in rows if row["mark_us"] is not None}
        assert marked == {"mix", "route", "dsum", "lred"}, marked


@pytest.mark.timeout(150)
def test_tp2_ranks_bit_identical():
    results = spawn(ranks.check_steps, 2, 130, [2], LAYERS, 5, env=ENV)
    for records in results:
        _check(records)
    for i in range(len(results[0])):
        for name in ("out", "prefix"):
            got = [records[i][name].view(torch.int16) for records in results]
            assert all(g.equal(got[0]) for g in got), f"step {i}: ranks' {name} differ"


@pytest.mark.timeout(900)
@pytest.mark.skipif(not os.environ.get("MONO_K2_MORE"), reason="MONO_K2_MORE=1: more widths")
def test_tp2_more_widths():
    """Every width 1..4 and 16 at TP 2 (minutes under the interpreter: off by default)."""
    results = spawn(ranks.check_steps, 2, 880, [1, 2, 3, 4, 16], LAYERS, 9, env=ENV)
    for records in results:
        _check(records)


@pytest.mark.timeout(150)
def test_tp4_ranks_bit_identical():
    """TP 4 of the tiny model: a router share (4 experts) smaller than a 16-row tile."""
    results = spawn(ranks.check_steps, 4, 130, [2], (3,), 1, env=ENV)
    for records in results:
        _check(records)
    outs = [records[0]["out"].view(torch.int16) for records in results]
    assert all(o.equal(outs[0]) for o in outs), "ranks' outputs differ"


@pytest.mark.timeout(100)
def test_checkpoint_layout_unpacked():
    """pack=False streams the checkpoint's mxfp4-k32 experts (Triton's scaled dot)."""
    (records,) = spawn(ranks.check_steps, 1, 80, [2], (3,), 2, False, env=ENV)
    _check(records)


@pytest.mark.timeout(150)
def test_late_rank_faults_every_rank_then_reset():
    results = spawn(ranks.fault_then_reset, 2, 130, 1, env=ENV)
    for rank, r in enumerate(results):
        assert r["fault"] is not None, f"rank {rank}: no MonoFault after a late rank"
        assert r["poisoned"], f"rank {rank}: the faulted step returned finite outputs"
        assert r["after_reset_err"] < 1e-2, f"rank {rank}: wrong step after reset()"


@pytest.mark.timeout(100)
def test_bad_input_raises_before_any_launch():
    (errors,) = spawn(ranks.bad_inputs, 1, 80, env=ENV)
    for arg, message in errors:
        assert message is not None, f"{arg}: accepted"
        assert message.startswith(arg), f"{arg}: the error does not name it: {message}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(programs=0), "programs"),
        (dict(programs=1.5), "programs"),
        (dict(widths=[]), "widths"),
        (dict(widths=[2.0]), "widths"),
        (dict(scratch_offset=100), "scratch_offset"),
    ],
)
def test_bad_construction_raises_before_allocating(kw, match, monkeypatch):
    """Refused before the MonoRunner (and its peer mapping) exists: nothing to leak."""
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.k2 import runner as k2_runner

    def no_runner(*a, **k):
        raise AssertionError("MonoRunner built before the arguments were checked")

    from mono_runtime.kernel import mono_layer_runner

    monkeypatch.setattr(mono_layer_runner, "MonoRunner", no_runner)  # where it is built
    with pytest.raises(ValueError, match=match):
        k2_runner.K2Runner(KimiK3Config.tiny(1), None, 0, "cpu", **({"widths": [1]} | kw))


@pytest.mark.timeout(60)
def test_device_topk_follows_the_routing_rule():
    """The route's top-k core on ties, NaN and -inf logits and a non-power-of-two E."""
    (rows,) = spawn(ranks.topk_cases, 1, 50, env=ENV)
    for r, (same, err, nan_alike) in enumerate(rows):
        assert same, f"row {r}: ids differ from mono_runtime.routing.sigmoid_topk"
        assert err < 1e-6 and nan_alike, f"row {r}: weights off by {err}"


@pytest.mark.timeout(100)
def test_every_item_waits_for_what_the_spec_says():
    """The kernel's waits, item by item, are spec.waits: a missing one passes every
    interpreter comparison (tickets run in order) and fails only on a GPU. It caught the
    shared down waiting for SI / SB of the shup items, not every K part (the H200's
    full-rank out rel 0.18: first columns wrong, the last, later items, right)."""
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.k2.spec import K2Build, stage_of

    (got, want) = spawn(ranks.kernel_waits, 1, 80, 2, 3, env=ENV)[0]
    b = K2Build(KimiK3Config.tiny(1), 2)
    for t in sorted(set(got) | set(want)):
        assert got.get(t, []) == want.get(t, []), (
            f"ticket {t} ({stage_of(b, t)}) waits for {got.get(t, [])}, spec: {want.get(t, [])}"
        )


@pytest.mark.parametrize(
    ("target", "tiny", "pack", "want"),
    [
        ("sm90", False, True, "gluon"),  # a TP8 rank's shapes, packed: the faster build
        ("sm100", False, True, "gluon"),
        ("sm90", False, False, "triton"),  # vLLM's own expert layout: no mxfp4-frag copy
        ("sm90", True, True, "triton"),  # tiny shapes: streams of one K step
        ("sm80", False, True, "triton"),
        ("gfx950", False, True, "triton"),
        ("interpreter", False, True, "triton"),
    ],
)
def test_the_default_engine_is_gluon_where_it_serves(target, tiny, pack, want):
    from mono_kernels_kimi.config import KimiK3Config
    from mono_kernels_kimi.k2.bench import rank_config
    from mono_kernels_kimi.k2.runner import choose_engine

    cfg = KimiK3Config.tiny(1) if tiny else rank_config()
    assert choose_engine(cfg, (1, 2, 4, 8, 16), target, pack, False) == want
