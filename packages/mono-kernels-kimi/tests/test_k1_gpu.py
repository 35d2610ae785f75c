"""K1 on one GPU at tiny and full per-rank shapes, eager and under CUDA graph replay,
against the reference (run on the same GPU in fp32 GEMM mode)."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.inputs import make_inputs

pytestmark = pytest.mark.gpu

CONFIGS = {"tiny": KimiK3Config.tiny(), "full": KimiK3Config()}
# (R, L, spec, layer_idx): block-write layer 0 (no delta) and 12, ordinary layers
SHAPES = [
    (1, 1, True, 13),
    (8, 1, True, 12),
    (1, 8, True, 13),
    (2, 4, True, 0),
    (3, 2, True, 14),
    (4, 1, False, 13),
    (16, 1, False, 14),  # the widest step: 16 rows
    (2, 8, True, 12),
]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _call(runner, inp):
    runner(inp.R, **inp.k1_kwargs())


def _compare(got, ref, want, pad):
    assert rel(got.out, want) < 1e-2
    assert rel(got.state, ref.state) < 1e-3
    assert rel(got.conv_state, ref.conv_state) < 1e-3
    assert torch.equal(got.prefix, ref.prefix) and torch.equal(got.blocks, ref.blocks)
    rows = [r * got.L + t for r in pad for t in range(got.L)]
    if rows:
        assert torch.all(got.out[rows] == 0)


def _inputs(cfg, R, L, spec, layer, seed):
    layer = layer % cfg.num_hidden_layers
    pad = (R - 1,) if R > 1 else ()
    return make_inputs(
        cfg, R, L, spec=spec, layer_idx=layer, delta=layer > 0, pad=pad, device="cuda", seed=seed
    ), pad


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", sorted(CONFIGS))
@pytest.mark.parametrize("R,L,spec,layer", SHAPES)
def test_k1_eager_and_graph_replay(size, R, L, spec, layer):
    from mono_kernels_kimi.kda.runner import KdaRunner

    cfg = CONFIGS[size]
    inp, pad = _inputs(cfg, R, L, spec, layer, seed=R * 8 + L)
    runner = KdaRunner(cfg, "cuda", L, spec=spec)

    # eager
    ref = inp.clone()
    want = ref.reference()
    got = inp.clone()
    _call(runner, got)
    torch.cuda.synchronize()
    runner.check()
    _compare(got, ref, want, pad)

    # graph: capture on static tensors, restore the inputs, replay twice (the control
    # words must come back zeroed for the second replay)
    static = inp.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _call(runner, static.clone())  # warm this shape outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(runner, static)
    for _ in range(2):
        for name in ("prefix", "blocks", "conv_cache", "state"):
            getattr(static, name).copy_(getattr(inp, name))
        if static.delta is not None:
            static.delta.copy_(inp.delta)
        static.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        runner.check()
        _compare(static, ref, want, pad)


@pytest.mark.timeout(600)
def test_k1_warm_compiles_every_build_and_writes_nothing():
    from mono_kernels_kimi.kda.runner import KdaRunner

    cfg = CONFIGS["full"]
    runner = KdaRunner(cfg, "cuda", 4)
    assert runner.layer_flags() == ((False, True), (True, False), (True, True))
    warmed = runner.warm()
    assert runner.widths == (1, 2, 3, 4)  # 16 rows at most
    assert {(b.requests, b.delta, b.write_block) for b in warmed} == {
        (r, d, w) for r in runner.widths for d, w in runner.layer_flags()
    }
    runner.check()


@pytest.mark.timeout(300)
def test_k1_bad_slot_raises_before_launch():
    from mono_kernels_kimi.kda.runner import KdaRunner

    cfg = CONFIGS["tiny"]
    inp, _ = _inputs(cfg, 2, 2, True, 3, seed=1)
    runner = KdaRunner(cfg, "cuda", 2)
    before = inp.clone()
    inp.state_indices[0, 1] = inp.state.shape[0]
    with pytest.raises(ValueError, match="`state_indices`"):
        _call(runner, inp)
    assert torch.equal(inp.state, before.state) and torch.equal(inp.prefix, before.prefix)


@pytest.mark.timeout(600)
def test_k1_bench_rows_smoke():
    """The benchmark runs and reports sane numbers (one shape, no baseline compile)."""
    from mono_kernels_kimi.kda.bench import rows

    (row,) = rows(shapes=((1, 2),), iters=20, baseline=False)
    assert row["k1_us"] > 0 and 0 < row["pct_of_floor"] < 150, row  # reads can beat the copy rate
    assert row["l2_x"] > 4, "the timed graph's weights must not fit in L2"


@pytest.mark.timeout(600)
def test_k1_give_up_while_serving_raises_and_poisons_eager_and_graph():
    """Issue 14's silent fault, on the GPU: a work item lost mid-serving (ticket 0 of the
    step's second launch drawn by a program that died) makes the waits for it give up at
    the runner's deadline, after_step() raise MonoFault and guard() poison the step's
    hidden states, eager and replayed from a CUDA graph; after reset() the same step is
    served again (as the plugin wires K1: k1_serving.Server)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from k1_serving import Server

    server = Server(None, 0, 1, R=2, L=2, device="cuda")
    server.mono.set_deadline(50_000_000)  # 50 ms
    try:
        seen = []
        for lose in (False, True, False):  # eager: served, faulted, served after reset()
            if lose:
                server.mono.tickets[1] = 1
            r = server.step()
            seen.append(r)
            if r["fault"] is not None:
                server.k1.reset()
        # graph: step_begin, both launches and the guard captured once, replayed
        static = [x.clone() for x in server.inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            server.forward([x.clone() for x in server.inputs])  # warm outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        assert server.after_step() is None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hidden = server.forward(static)
        for lose in (False, True, False):
            for x, i in zip(static, server.inputs, strict=True):
                for name in ("prefix", "delta", "blocks", "conv_cache", "state"):
                    getattr(x, name).copy_(getattr(i, name))
                x.out.fill_(0.0)
            if lose:
                server.mono.tickets[1] = 1
            graph.replay()
            r = server.measure(static, hidden, server.after_step())
            seen.append(r)
            if r["fault"] is not None:
                server.k1.reset()
    finally:
        server.close()
    for n, r in enumerate(seen):
        where = f"{'eager' if n < 3 else 'graph'} step {n % 3 + 1}"
        if n % 3 == 1:
            assert r["fault"] is not None and "kda.ares pair 0" in r["fault"], (where, r)
            assert r["hidden_nan"] and r["out_nan"][1] and r["state_kept"][1], (where, r)
        else:
            assert r["fault"] is None and r["hidden_finite"], (where, r)
            assert r["out_err"] < 1e-2 and r["state_err"] < 1e-3, (where, r)
