"""K2 on an NVIDIA GPU (`-m gpu`): tiny (the Triton build) and full per-rank TP8 shapes
(both builds) on one rank (a block-write and a plain layer, a padded row), CUDA graph
replay with padding, and the benchmark's op-by-op path and figures."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2.inputs import step_inputs
from mono_kernels_kimi.k2.reference import k2_reference
from mono_kernels_kimi.k2.runner import K2Runner
from mono_kernels_kimi.k2.weights import random_weights

pytestmark = pytest.mark.gpu


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _same_choice(ids, weights, ref, where):
    """The same experts per row with the same weights, in any order: two experts whose
    router scores differ by an fp32 rounding (the kernel's dot sums in another order than
    the reference's) may come out of the top-k in either order."""
    ids, order = ids.long().sort(-1)
    want, ref_order = ref.topk_ids.sort(-1)
    assert torch.equal(ids, want), f"{where}: expert choice differs"
    got_w, want_w = weights.gather(-1, order), ref.topk_weights.gather(-1, ref_order)
    assert torch.allclose(got_w, want_w, rtol=1e-3, atol=1e-6), f"{where}: expert weights"


def _steps(cfg, w, widths, layers, seed, engine="triton"):
    """Eager steps of `widths` x `layers` on build `engine` against the reference."""
    runner = K2Runner(cfg, None, 0, "cuda", widths=widths, engine=engine)
    w = runner.pack(w)
    runner.warm()
    try:
        for s in widths:
            for layer in layers:
                step = step_inputs(
                    cfg, s, seed=seed + s, device="cuda", padding=(1,) if s > 1 else ()
                )
                prefix = step.prefix.clone()
                runner.step_begin()
                out = runner(step.cores[0], prefix, step.blocks, w, step.slots, layer, final=True)
                runner.after_step()
                ref = k2_reference(cfg, step.cores, step.prefix, step.blocks, [w], layer, step.live)
                where = f"S={s} layer {layer}"
                _same_choice(*runner.routing(s), ref, where)
                assert rel(out, ref.out) < 1e-2, f"{where}: out rel {rel(out, ref.out):.2e}"
                assert rel(prefix, ref.prefix) < 1e-2, f"{where}: prefix rel"
                assert (out[~step.live] == 0).all(), f"{where}: a padding row got output"
                assert torch.equal(prefix[~step.live], step.prefix[~step.live])
    finally:
        runner.close()


@pytest.mark.timeout(600)
def test_tiny_widths_one_rank():
    cfg = KimiK3Config.tiny(1)
    _steps(cfg, random_weights(cfg, seed=1, device="cuda"), [1, 3, 8, 16], (2, 3), 10)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["triton", "gluon"])
def test_full_rank_shapes_one_rank(engine):
    """Kimi-K3 at a TP8 rank's o_proj and expert widths, launched at TP 1, on each build."""
    from mono_kernels_kimi.k2.bench import LAYER_IDX, random_layer, rank_config

    cfg = rank_config()
    _steps(cfg, random_layer(cfg, 2, "cuda"), [1, 4, 16], (LAYER_IDX,), 20, engine)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["triton", "gluon"])
def test_graph_replay_with_padding(engine):
    """A graph captured for 4 rows, replayed with 2 real rows and 2 padding rows (the Gluon
    build at a TP8 rank's shapes: it cannot lower the tiny ones' one-step streams)."""
    from mono_kernels_kimi.k2.bench import LAYER_IDX, random_layer, rank_config

    if engine == "triton":
        cfg, layer = KimiK3Config.tiny(1), 3
        w = random_weights(cfg, seed=5, device="cuda")
    else:
        cfg, layer = rank_config(), LAYER_IDX
        w = random_layer(cfg, 5, "cuda")
    runner = K2Runner(cfg, None, 0, "cuda", widths=[4], engine=engine)
    w = runner.pack(w)
    runner.warm()
    step = step_inputs(cfg, 4, seed=77, device="cuda")
    core, prefix, blocks, slots = (
        step.cores[0].clone(),
        step.prefix.clone(),
        step.blocks,
        step.slots,
    )
    out = torch.empty_like(prefix)

    def launch():
        runner.step_begin()
        runner(core, prefix, blocks, w, slots, layer, out=out, final=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    runner.after_step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for replay in range(3):
        new = step_inputs(cfg, 4, seed=90 + replay, device="cuda", padding=(2, 3))
        core.copy_(new.cores[0])
        prefix.copy_(new.prefix)
        slots.copy_(new.slots)
        graph.replay()
        torch.cuda.synchronize()
        runner.after_step()
        ref = k2_reference(cfg, new.cores, new.prefix, blocks, [w], layer, new.live)
        assert rel(out, ref.out) < 1e-2
        assert (out[2:] == 0).all(), "padding rows got output"
        if engine == "triton":  # tiny shapes: the reference's sums, bit for bit
            assert torch.equal(prefix, ref.prefix)
        else:  # full shapes: o_proj's sums in the mma.sync order, rounded to bf16
            assert rel(prefix, ref.prefix) < 1e-2
    runner.close()


@pytest.mark.timeout(600)
def test_opbyop_path_matches_reference():
    from mono_kernels_kimi.k2.bench import OpByOp, random_layer

    cfg = KimiK3Config.tiny(1)
    w = random_layer(cfg, 6, "cuda")
    step = step_inputs(cfg, 8, seed=3, device="cuda")
    prefix = step.prefix.clone()
    out = OpByOp(cfg, [w], 3)(step.cores[0], prefix, step.blocks.clone())
    ref = k2_reference(cfg, step.cores, step.prefix, step.blocks, [w], 3)
    assert rel(prefix, ref.prefix) < 1e-2
    assert rel(out, ref.out) < 2e-2


@pytest.mark.timeout(900)
def test_bench_rows():
    from mono_kernels_kimi.k2.bench import bench

    for r in bench(rows=(1, 16), layers=4):
        print(r)
        assert r["kernel_us"] > 0 and r["bytes"] > 0 and r["note"] is None, r
        assert r["l2_x"] > 4, "the timed graph's weights must not fit in L2"
        assert 0 < r["limit_pct"] < 150, r  # reads can beat the copy rate a little
