"""The benchmark's stock baseline (ffn/stock.py: vLLM's HUMMING MXFP4 experts).

On the CPU: the weights it builds are vLLM's own HUMMING conversion bit for bit (vLLM's
function run with humming's CUDA repack replaced by test_ffn_sources' transcription), its
activation expression is reference.swiglu_oai, its routing alignment (Triton interpreter)
is the grouping humming's indexed GEMMs read, and the benchmark records why the path is
missing instead of failing. On a GPU (`-m gpu`, needs ``humming`` importable): its output
at the full per-rank shapes against the FFN reference, eager and under graph replay.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import math
import re
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn import bench, stock
from mono_kernels_minimax.ffn.reference import swiglu_oai
from mono_kernels_minimax.formats import WeightFormat


def _load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- weights: vLLM's conversion --------------------------------------------------------------
@contextlib.contextmanager
def sm90_on_the_cpu(repack):
    """humming's conversion on the CPU as on an SM90 GPU: its device queries answered so,
    its CUDA repack kernel replaced by `repack`."""
    import humming.device
    import humming.transform

    sm90 = types.SimpleNamespace(is_ppu=False, sm_version=90, sm_major=9)
    with contextlib.ExitStack() as stack:
        for target, name, value in (
            (humming.device.current_device, "_value", sm90),
            (humming.transform, "DeviceInfo", lambda *_: sm90),
            (humming.transform.ops, "repack_weight", repack),
            (torch.cuda, "device", lambda *_: contextlib.nullcontext()),
        ):
            stack.enter_context(mock.patch.object(target, name, value))
        yield


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inter", [128, 64])  # 64: vLLM pads w13's N to 256
def test_weights_are_vllms_humming_conversion(inter):
    sources = _load("test_ffn_sources")
    e, h = 2, 256
    w13, w2 = sources.checkpoint(e, 2 * inter, h, 1), sources.checkpoint(e, h, inter, 2)
    layer = sources.vllm_humming(w13, w2, inter)  # skips without vLLM or humming
    with sm90_on_the_cpu(sources.humming_repack):
        got = {
            "w13": stock.humming_experts(*w13, 2 * inter, h, gate_up=True),
            "w2": stock.humming_experts(*w2, h, inter, gate_up=False),
        }
    for name, (config, tensors) in got.items():
        assert config == layer.humming_configs[name], name
        assert set(tensors) == {"weight", "weight_scale"}, name
        for key, t in tensors.items():
            want = getattr(layer, f"{name}_{key}").data
            assert t.dtype == want.dtype and torch.equal(
                t.view(torch.uint8), want.view(torch.uint8)
            )
    assert got["w13"][1]["weight"].data_ptr() != w13[0].data_ptr()


# -- the activation ----------------------------------------------------------------------------
def _as_python(expression: str):
    """The CUDA expression of `a` and `b` as a Python function (its functions and float
    literals are all this needs)."""
    py = re.sub(r"(\d+\.\d*(?:e-?\d+)?)f\b", r"\1", expression)
    py = py.replace("1.f", "1.0")
    for c, p in (("fminf", "min"), ("fmaxf", "max"), ("expf", "math.exp")):
        py = py.replace(c, p)
    assert not re.search(r"[;{}]", py), py
    return eval(f"lambda a, b: {py}", {"math": math})  # noqa: S307 (our own string)


def test_activation_expression_is_swiglu_oai():
    cfg = MiniMaxM3Config()
    fn = _as_python(stock.activation_impl(cfg))
    g = torch.linspace(-12, 12, 97, dtype=torch.float64)
    gate, up = torch.meshgrid(g, g.flip(0), indexing="ij")
    want = swiglu_oai(cfg, torch.cat((gate.reshape(-1, 1), up.reshape(-1, 1)), -1)).squeeze(-1)
    pairs = zip(gate.flatten().tolist(), up.flatten().tolist(), strict=True)
    got = torch.tensor([fn(a, b) for a, b in pairs], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# -- routing alignment ------------------------------------------------------------------------
def expected_alignment(ids: torch.Tensor, block: int, experts: int):
    """(sorted ids, expert of each block, total) built pair by pair."""
    flat = ids.flatten().tolist()
    sorted_ids, blocks = [], []
    for e in range(experts):
        mine = [n for n, x in enumerate(flat) if x == e]
        if mine:
            padded = -(-len(mine) // block) * block
            sorted_ids += mine + [len(flat)] * (padded - len(mine))
            blocks += [e] * (padded // block)
    return sorted_ids, blocks, len(sorted_ids)


ALIGN_CASES = [
    # vLLM's moe_align_block_size docstring example (experts 1..4 of 5, block 4)
    (torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]), 4, 5),
    (torch.tensor([[7, 3, -1, 2]]), 8, 128),  # a padding id is left out
    *[
        (
            torch.randperm(128, generator=torch.Generator().manual_seed(s))[: 4 * s].view(s, 4),
            8,
            128,
        )
        for s in (1, 4, 16)
    ],  # fmt: skip
    (torch.randint(0, 6, (16, 4), generator=torch.Generator().manual_seed(3)), 16, 6),
]


def check_alignment(got, ids, block, experts):
    sorted_ids, blocks, total = (t.cpu() for t in got)
    want_ids, want_blocks, want_total = expected_alignment(ids, block, experts)
    slots, nblocks = stock.align_slots(ids.numel(), block, experts)
    assert sorted_ids.shape == (slots,) and blocks.shape == (nblocks,)
    assert int(total) == want_total
    assert sorted_ids[:want_total].tolist() == want_ids
    assert (sorted_ids[want_total:] == ids.numel()).all()  # unused slots: the pad index
    assert blocks[: want_total // block].tolist() == want_blocks
    assert (blocks[want_total // block :] == 0).all()


def _align_interpreted(rank, world, group):
    return [stock.align(ids, block, experts) for ids, block, experts in ALIGN_CASES]


@pytest.mark.timeout(120)
def test_alignment_in_the_interpreter():
    from mono_peer.testing import spawn

    results = spawn(_align_interpreted, 1, 100, env={"TRITON_INTERPRET": "1"})[0]
    for got, (ids, block, experts) in zip(results, ALIGN_CASES, strict=True):
        check_alignment(got, ids, block, experts)


def test_tuning_entry_holds_the_rows():
    table = [(0, 4, {"block_shape": (8, 256, 128)}), (4, 8, {"block_shape": (16, 128, 128)})]
    assert stock.tuning_entry(table, 4)["block_shape"][0] == 8
    assert stock.tuning_entry(table, 5)["block_shape"][0] == 16
    assert stock.tuning_entry(table, 9) is None


# -- the path's plumbing, humming's kernels emulated ------------------------------------------
def emulated_gemm(config, inputs, weight, weight_scale=None, **kw):
    """What humming's indexed GEMM computes, in torch: every slot of the used blocks names a
    routed pair (pad index: none), whose token (pair // top_k) row goes through its
    block's expert; `weight` read back to the checkpoint layout with stream.sources."""
    from mono_kernels_minimax.formats import dequantize
    from mono_runtime.stream.sources import ExpertLayout, unpack_experts

    n, k = config.shape_n - config.pad_shape_n, config.shape_k - config.pad_shape_k
    codes, scales = unpack_experts(ExpertLayout.HUMMING, weight.clone(), weight_scale.clone(), n, k)
    dense = dequantize(codes, scales, WeightFormat.MXFP4)
    out, top_k, block = (
        kw["outputs"],
        kw["top_k"],
        json.loads(kw["tuning_config"])["block_shape"][0],
    )
    for b in range(int(kw["num_tokens_padded"]) // block):
        for pair in kw["sorted_ids"][b * block : (b + 1) * block].tolist():
            if pair < out.shape[0]:
                row = inputs[pair // top_k].float() @ dense[int(kw["expert_ids"][b])].t()
                out[pair] = row.to(out.dtype)
    return out


def aligned_in_torch(ids, block, experts):
    """`stock.align`'s outputs built pair by pair (the kernel itself: the tests above)."""
    sorted_ids, blocks, total = expected_alignment(ids, block, experts)
    slots, nblocks = stock.align_slots(ids.numel(), block, experts)
    sorted_ids += [ids.numel()] * (slots - len(sorted_ids))
    blocks += [0] * (nblocks - len(blocks))
    return tuple(torch.tensor(v, dtype=torch.int32) for v in (sorted_ids, blocks, [total]))


@pytest.mark.timeout(120)
def test_plumbing_with_hummings_kernels_emulated():
    """Shapes, buffers, alignment and arguments of the path on the tiny config, humming's
    GEMMs and activation emulated in torch (eager, no torch.compile): S = 1 (4 routed rows)
    takes the first tuning entry, S = 4 (16) the second, for both GEMMs; the output
    against the reference."""
    pytest.importorskip("humming")
    import humming.forward
    import humming.tune
    from mono_kernels_minimax.ffn.reference import ffn_reference

    cfg = MiniMaxM3Config.tiny()
    tuned = []

    def gemm(config, inputs, weight, weight_scale=None, **kw):
        inspect.signature(humming.forward.humming_forward).bind(
            config, inputs, weight, weight_scale, **kw
        )  # the real function takes these arguments
        tuned.append(json.loads(kw["tuning_config"])["block_shape"][0])
        return emulated_gemm(config, inputs, weight, weight_scale, **kw)

    def activation(config, inputs, *, outputs, activation_type, activation_impl):
        assert activation_type == "binary_split" and "expf" in activation_impl
        return outputs.copy_(swiglu_oai(cfg, inputs.float())), None, None

    table = [(0, 4, {"block_shape": (8, 128, 64)}), (4, 64, {"block_shape": (16, 128, 64)})]
    sms = types.SimpleNamespace(multi_processor_count=132)
    with contextlib.ExitStack() as stack:
        stack.enter_context(sm90_on_the_cpu(_load("test_ffn_sources").humming_repack))
        for target, name, value in (
            (humming.forward, "humming_forward", gemm),
            (humming.forward, "may_process_input", activation),
            (humming.tune, "get_heuristics_config", lambda **_: table),
            (stock, "align", aligned_in_torch),
            (torch.cuda, "get_device_properties", lambda *_: sms),
            (torch, "compile", lambda fn, **_: fn),
        ):
            stack.enter_context(mock.patch.object(target, name, value))
        w = bench.random_layer(cfg, WeightFormat.MXFP4, 0, "cpu")
        path = stock.Stock(cfg, [w])
        for s in (1, 4):
            g = torch.Generator().manual_seed(s)
            part, residual = (torch.randn(s, cfg.hidden_size, generator=g).bfloat16() for _ in "pr")
            out, _ = path(part, residual)
            ref = ffn_reference(cfg, [part], residual, [w]).out.float()
            err = float((out.float() - ref).norm() / ref.norm())
            assert err < 1e-2, f"S={s}: rel-L2 {err}"
    assert tuned == [8, 8, 16, 16]


# -- the benchmark's wiring -------------------------------------------------------------------
def test_bench_records_why_the_stock_path_is_missing(monkeypatch):
    cfg = MiniMaxM3Config.tiny()
    ws = [bench.random_layer(cfg, WeightFormat.MXFP4, 0, "cpu")]
    monkeypatch.setattr(stock, "humming_missing", lambda: "humming not importable: (test)")
    bases = bench._baselines(cfg, WeightFormat.MXFP4, ws)
    assert [(label, why) for label, _, why in bases] == [
        (bench.OpByOp.label, None),
        (stock.STOCK_LABEL, "stock path not built: humming not importable: (test)"),
    ]
    times, notes = bench._time_baselines(bases[1:], None, None, 1)
    assert times == {} and notes == ["stock path not built: humming not importable: (test)"]
    fp8 = [bench.random_layer(cfg, WeightFormat.FP8, 0, "cpu")]
    assert [label for label, _, _ in bench._baselines(cfg, WeightFormat.FP8, fp8)] == [
        bench.OpByOp.label
    ]


def test_stock_refuses_weights_it_cannot_read(monkeypatch):
    cfg = MiniMaxM3Config.tiny()
    monkeypatch.setattr(stock, "humming_missing", lambda: None)
    fp8 = bench.random_layer(cfg, WeightFormat.FP8, 0, "cpu")
    with pytest.raises(ValueError, match=r"layers\[0\]: the stock path needs MXFP4"):
        stock.Stock(cfg, [fp8])
    monkeypatch.setattr(stock, "humming_missing", lambda: "humming not importable: (test)")
    with pytest.raises(RuntimeError, match="humming not importable"):
        stock.Stock(cfg, [fp8])


def test_table_shows_the_stock_columns_where_measured():
    row = dict(
        format="mxfp4", rows=1, layers=12, kernel_us=30.0, bytes=5e7, copy_tbps=4.0,
        limit_pct=40.0, l2_x=10.0, opbyop_us=90.0, speedup=3.0, experts_read=5.0, note=None,
    )  # fmt: skip
    assert "stock_us" not in bench.table([row])
    lines = bench.table([{**row, "stock_us": 60.0, "stock_speedup": 2.0}]).splitlines()
    head = lines[0].split()
    assert head[head.index("speedup") + 1 : head.index("speedup") + 3] == [
        "stock_us",
        "stock_speedup",
    ]
    assert lines[1].split()[head.index("stock_us")] == "60.0"


# -- on a GPU ---------------------------------------------------------------------------------
def _need_humming_gpu():
    if not torch.cuda.is_available() or torch.version.hip:
        pytest.skip("HUMMING's kernels need an NVIDIA GPU")
    why = stock.humming_missing()
    if why:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_alignment_on_the_gpu():
    _need_humming_gpu()
    for ids, block, experts in ALIGN_CASES:
        check_alignment(stock.align(ids.cuda(), block, experts), ids, block, experts)


@pytest.mark.gpu
@pytest.mark.timeout(290)
def test_stock_matches_the_reference_at_full_rank_shapes():
    """MiniMax-M3 at a TP4 rank's expert width (I = 768), S = 1 and 4: same experts, rel-L2
    under 1e-2 against reference.ffn_reference, eager and under graph replay."""
    _need_humming_gpu()
    from mono_kernels_minimax.ffn.reference import ffn_reference

    rel_l2 = _load("ffn_ranks").rel_l2
    cfg = bench.rank_config()
    w = bench.random_layer(cfg, WeightFormat.MXFP4, 11, "cuda")
    path = stock.Stock(cfg, [w])
    g = torch.Generator(device="cuda").manual_seed(5)
    for s in (1, 4):
        part, residual = (
            torch.randn(s, cfg.hidden_size, generator=g, device="cuda").to(torch.bfloat16)
            for _ in range(2)
        )
        ref = ffn_reference(cfg, [part], residual, [w])
        _, _, ids, _ = path.routing(part, residual)
        assert torch.equal(ids.sort(-1).values, ref.topk_ids.sort(-1).values), f"S={s}"
        out, res = path(part, residual)
        assert rel_l2(res, ref.residual) < 1e-6, f"S={s}"
        assert rel_l2(out, ref.out) < 1e-2, f"S={s}: rel-L2 {rel_l2(out, ref.out)}"

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            path(part, residual)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed, _ = path(part, residual)
        part.copy_(torch.randn(s, cfg.hidden_size, generator=g, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref = ffn_reference(cfg, [part], residual, [w])
        assert rel_l2(replayed, ref.out) < 1e-2, f"S={s} replay: {rel_l2(replayed, ref.out)}"
