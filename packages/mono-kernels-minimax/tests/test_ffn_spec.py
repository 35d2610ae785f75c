"""Pure-Python parts: config, formats (checked against their definitions), spec, reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn.reference import route, swiglu_oai
from mono_kernels_minimax.ffn.spec import (
    Experts,
    FfnBuild,
    max_tickets,
    peer_bytes,
    peer_layout,
    scratch_bytes,
    scratch_layout,
)
from mono_kernels_minimax.ffn.weights import random_weights
from mono_kernels_minimax.formats import (
    WeightFormat,
    dequantize,
    pack_fp8,
    pack_mxfp4,
    unpack_mxfp4,
)
from mono_runtime.stream.layout import MX_FAST_ROWS
from mono_runtime.timeline import stage_deps, stamp_bytes

# OCP MX v1.0, table of FP4 E2M1: code -> value (bit 3 sign, bits 2..1 exponent, bit 0 mantissa)
OCP_E2M1 = {
    0b0000: 0.0,
    0b0001: 0.5,
    0b0010: 1.0,
    0b0011: 1.5,
    0b0100: 2.0,
    0b0101: 3.0,
    0b0110: 4.0,
    0b0111: 6.0,
}


def test_config_real_values():
    c = MiniMaxM3Config()
    assert (c.hidden_size, c.num_experts, c.top_k, c.moe_intermediate_size) == (6144, 128, 4, 3072)
    assert c.per_rank_intermediate(4) == 768 and c.per_rank_shared_intermediate(4) == 768
    assert c.num_moe_layers == 57 and c.routed_scaling_factor == 2.0
    assert (c.swiglu_alpha, c.swiglu_beta, c.swiglu_limit) == (1.702, 1.0, 7.0)
    with pytest.raises(ValueError, match="block-32"):
        c.per_rank_intermediate(5)
    t = MiniMaxM3Config.tiny()
    assert t.top_k == c.top_k and t.n_shared_experts == 1 and t.per_rank_intermediate(4) == 32


def test_mxfp4_layout_follows_its_definition():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 64), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 135, (3, 2), generator=g, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # even k in the low nibble
    got = unpack_mxfp4(packed, scales)
    for r in range(3):
        for k in range(64):
            c = int(codes[r, k])
            v = OCP_E2M1[c & 7] * (-1 if c & 8 else 1) * 2.0 ** (int(scales[r, k // 32]) - 127)
            assert got[r, k].item() == v
    # values on the grid survive a pack round trip exactly
    vals, sc = pack_mxfp4(got)
    assert torch.equal(unpack_mxfp4(vals, sc), got)


def test_mxfp4_quantization_error_is_block_bounded():
    w = torch.randn(8, 256, generator=torch.Generator().manual_seed(1))
    v, s = pack_mxfp4(w)
    assert v.shape == (8, 128) and s.shape == (8, 8) and v.dtype == s.dtype == torch.uint8
    err = (unpack_mxfp4(v, s) - w).abs().reshape(8, 8, 32).amax(-1)
    # OCP scale 2**(floor(log2 amax) - 2): codes round to the grid (gap <= 2 units) and
    # saturate at 6 units (amax may reach just under 8): error <= 2 units of the block
    unit = torch.exp2(s.float() - 127)
    assert (err <= 2 * unit + 1e-6).all()


def test_fp8_block_layout():
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(2))
    q, s = pack_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
    assert ((dequantize(q, s, WeightFormat.FP8) - w).norm() / w.norm()) < 0.05


def test_build_key_and_layouts():
    cfg = MiniMaxM3Config()
    b = FfnBuild(cfg, 16, 4)
    assert b.layout == "mxfp4-rot" and b.inter == 768 and b.max_slots == 65
    assert FfnBuild(cfg, 16, 4, packed=False).layout == "mxfp4-k32"
    assert b.key() != FfnBuild(cfg, 16, 4, packed=False).key()
    assert FfnBuild(cfg, 1, 4).max_slots == 5
    assert b.key() != FfnBuild(cfg, 16, 4, WeightFormat.FP8).key()
    lay = scratch_layout(b)
    spans = sorted(lay.values())
    assert all(a[0] + a[1] <= c[0] for a, c in zip(spans, spans[1:], strict=False)), "overlap"
    assert all(off % 256 == 0 for off, _ in spans)
    assert scratch_bytes(b) >= spans[-1][0] + spans[-1][1]
    assert lay["done"][1] == 8 * (max_tickets(b) + b.max_slots + 1)  # + the route's
    pl = peer_layout(cfg, 4)
    assert pl["ar1"][1] == 4 * 16 * 3072 * 8 and peer_bytes(cfg, 4) > pl["hs"][0]
    for bad, match in (
        (dict(rows=17), "rows=17"),
        (dict(rows=0), "rows=0"),
        (dict(tp=3), "tp=3"),
        (dict(weights="mxfp4"), "WeightFormat"),
        (dict(experts="all"), "Experts"),
    ):
        with pytest.raises(ValueError, match=match):
            FfnBuild(**{"cfg": cfg, "rows": 1, "tp": 4, **bad})
    tl = FfnBuild(cfg, 16, 4, timeline=True)
    assert tl.key() != b.key() and "timeline" not in lay
    assert scratch_layout(tl)["timeline"][1] == stamp_bytes(max_tickets(tl))
    with pytest.raises(ValueError, match="128-aligned"):
        FfnBuild(MiniMaxM3Config.tiny(), 1, 4, WeightFormat.FP8)


def test_route_ties_to_lower_id_and_nan_last():
    cfg = MiniMaxM3Config.tiny()
    e, h = cfg.num_experts, cfg.hidden_size
    logits = torch.zeros(2, e)
    logits[0, 7] = 5.0  # the best score, but its key is NaN (bias): ranks last
    logits[0, 5] = logits[0, 9] = 2.0  # equal keys: 5 before 9, then 0, 1 (ties again)
    logits[1, 3] = 1.0
    router = torch.zeros(e, h)
    router[:, :2] = logits.t()  # row s of eye(2, h) picks column s: logits[s, e]
    bias = torch.zeros(e)
    bias[7] = float("nan")
    ids, wt = route(cfg, torch.eye(2, h).to(torch.bfloat16), router, bias)
    assert ids[0].tolist() == [5, 9, 0, 1]
    assert ids[1].tolist() == [3, 0, 1, 2]
    assert torch.allclose(wt.sum(-1), torch.full((2,), cfg.routed_scaling_factor))


def test_swiglu_oai_matches_vllm_formula():
    cfg = MiniMaxM3Config()
    x = torch.linspace(-12, 12, 64).repeat(2, 2)
    d = x.shape[-1] // 2
    # SiluAndMulWithClamp.forward_native, vLLM 0.33 (model_executor/layers/activation.py)
    gate = torch.clamp(x[..., :d], max=7.0)
    up = torch.clamp(x[..., d:], min=-7.0, max=7.0)
    want = gate * torch.sigmoid(1.702 * gate) * (up + 1.0)
    assert torch.equal(swiglu_oai(cfg, x), want)


def test_random_weights_validate_and_refuse_other_shapes():
    cfg = MiniMaxM3Config.tiny()
    for fmt in (WeightFormat.BF16, WeightFormat.MXFP4):
        w = random_weights(cfg, 2, fmt)
        w.validate(cfg, 2)
        with pytest.raises(ValueError, match="weights.w13: shape"):
            w.validate(cfg, 4)  # another TP's shard
    assert Experts("routed") is Experts.ROUTED


def test_mxfp4_nibble_order_is_vllms():
    """vLLM's own decoder of packed e2m1 bytes (low nibble first) reads our packing alike."""
    utils = pytest.importorskip(
        "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils"
    )
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (4, 64), generator=g, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    ones = torch.full((4, 2), 127, dtype=torch.uint8)  # e8m0 1.0
    assert torch.equal(utils.break_fp4_bytes(packed, torch.float32), unpack_mxfp4(packed, ones))


def test_streaming_plan_fills_the_gpu_at_one_row():
    """S = 1 at TP4 shapes: split-K up items and per-slot down items (the shared expert's,
    then one group per routed expert: no empty group) give every one of 132 SMs about two
    items per expert stage (one item per SM leaves HBM idle on the tail)."""
    b = FfnBuild(MiniMaxM3Config(), 1, 4)
    p = b.plan
    up = p.nc * p.uks0 + (b.max_slots - 1) * p.nc * p.uks
    assert p.ng == b.max_slots - 1 == 4
    assert up >= 2 * 132 and p.down * (1 + p.ng) >= 1.8 * 132
    assert (768 // p.bn) == p.nc and 6144 % (p.ubk * p.uks) == 0 and 768 % p.dbk == 0


@pytest.mark.parametrize("weights", list(WeightFormat))
def test_every_real_shape_has_a_plan(weights):
    """Every build the plugin may ask for at real shapes gets tiles that divide what they
    walk (TP 8 halves I per rank to 384: a 256-wide K step no longer divides it)."""
    for tp in (1, 2, 4, 8):
        for rows in range(1, 17):
            for experts in Experts:
                b = FfnBuild(MiniMaxM3Config(), rows, tp, weights, experts)
                p = b.plan
                assert b.inter % p.dbk == 0 and b.inter % p.dbk0 == 0 and b.inter % p.bn == 0
                assert max_tickets(b) > 0
                if weights is WeightFormat.MXFP4:  # fewer rows streamed 4-10x slower (H200)
                    assert min(p.bn, p.dc) >= MX_FAST_ROWS, (tp, rows, p.bn, p.dc)


def test_tile_overrides_are_checked(monkeypatch):
    from mono_kernels_minimax.ffn.spec import TILES_ENV

    monkeypatch.setenv(TILES_ENV, "bn=128,uks=2,occ=3,regs=168")
    p = FfnBuild(MiniMaxM3Config(), 1, 4).plan
    assert (p.bn, p.uks, p.occ, p.regs) == (128, 2, 3, 168)
    bad_tiles = ("bn=48", "uks=5", "dbk=16", "nope=1", "bn=x", "warps=2", "occ=4", "regs=100")
    for bad in bad_tiles + (
        "regs=32",
        "regs=256",
        "rrows=32",
        "rrows=3",
        "upf=2",
        "ust=9",
        "spf=2",
        "sfirst=2",
        "rt=3",
        "rcall=1",  # a tile no longer built
        "rr=3",
        "rr=32",
        "racc=2",  # a tile no longer built
    ):
        monkeypatch.setenv(TILES_ENV, bad)
        with pytest.raises(ValueError, match="FFN tiles|MONO_FFN_TILES"):
            _ = FfnBuild(MiniMaxM3Config(), 1, 4).plan


def test_gluon_wide_tiles(monkeypatch):
    """The Gluon build at S > 4 takes its own tiles (one-ring pair, 128 down rows, 16 slot
    groups), the Triton build and S <= 4 keep theirs; the one-ring pair with gate blocks
    too narrow for the warps is refused before any compile."""
    from mono_kernels_minimax.ffn.spec import TILES_ENV

    monkeypatch.delenv(TILES_ENV, raising=False)
    cfg = MiniMaxM3Config()

    def tiles(rows, frag):
        p = FfnBuild(cfg, rows, 4, frag=frag).plan
        return p.pair, p.dc, p.ng

    assert tiles(8, True) == (3, 128, 16) and tiles(16, True) == (3, 128, 16)
    assert tiles(8, False) == (1, 64, 8) and tiles(4, True) == (2, 128, 8)
    monkeypatch.setenv(TILES_ENV, "pair=3,bn=32")
    with pytest.raises(ValueError, match="pair 3 .* needs bn >= 16 x warps"):
        _ = FfnBuild(cfg, 8, 4, frag=True).plan
    assert FfnBuild(cfg, 8, 4).plan.pair == 3  # Triton runs pair 3 as one tile


def test_fp8_k_steps_per_build(monkeypatch):
    """FP8 K steps stay inside one 128 x 128 scale block in the Triton build (one scale a
    step) and may span two in the Gluon build (each half step takes its own scale)."""
    from mono_kernels_minimax.ffn.spec import TILES_ENV

    monkeypatch.setenv(TILES_ENV, "ubk=256,dbk=256")
    cfg = MiniMaxM3Config()
    assert FfnBuild(cfg, 1, 4, WeightFormat.FP8, frag=True).plan.ubk == 256
    with pytest.raises(ValueError, match="ubk <= 128 for fp8 in this build"):
        _ = FfnBuild(cfg, 1, 4, WeightFormat.FP8).plan
    monkeypatch.setenv(TILES_ENV, "ubk=512")
    with pytest.raises(ValueError, match="ubk <= 256 for fp8 in this build"):
        _ = FfnBuild(cfg, 1, 4, WeightFormat.FP8, frag=True).plan


@pytest.mark.parametrize("sfirst", [0, 1])
def test_shared_up_order_follows_sfirst(monkeypatch, sfirst):
    """The shared expert's up items take the tickets right after the router's (sfirst 1)
    or right after the routed up items (0); either way every stage keeps its size and the
    tickets stay contiguous."""
    from mono_kernels_minimax.ffn.spec import TILES_ENV, stage_bounds

    monkeypatch.setenv(TILES_ENV, f"sfirst={sfirst}")
    b = FfnBuild(MiniMaxM3Config(), 1, 4)
    bounds = stage_bounds(b, 5, final=True)
    names = [n for n, _, _ in bounds]
    assert names.index("shared-up") == names.index("route") + (1 if sfirst else 2)
    assert all(hi == lo2 for (_, _, hi), (_, lo2, _) in zip(bounds, bounds[1:], strict=False))
    sizes = {n: hi - lo for n, lo, hi in bounds}
    assert sizes["shared-up"] == b.plan.nc * b.plan.uks0
    assert sizes["up"] == 4 * b.plan.nc * b.plan.uks


@pytest.mark.parametrize(("rows", "tiles", "items"), [(1, "", 0), (16, "", 0), (5, "rr=4", 2),
                                                      (16, "rr=4", 4), (2, "rr=1", 2)])  # fmt: skip
def test_route_stage_follows_rr(monkeypatch, rows, tiles, items):
    """Wide steps route in ceil(S / rr) items after the router's, each waiting for every
    router item, the last also for the norm (it marks the route); without the stage the
    last router item routes and waits for seam and norm."""
    from mono_kernels_minimax.ffn.spec import TILES_ENV, route_items, stage_bounds, waits

    monkeypatch.setenv(TILES_ENV, tiles)
    b = FfnBuild(MiniMaxM3Config(), rows, 4)
    assert route_items(b) == items
    at = {n: range(lo, hi) for n, lo, hi in stage_bounds(b, 5, final=True)}
    w = waits(b, 5, final=True)
    seam, norm, router = list(at["seam"]), list(at["norm"]), list(at["router"])
    assert len(at["route"]) == items
    for t in router[:-1]:
        assert w[t] == seam
    if items:
        assert w[router[-1]] == seam
        assert [w[t] for t in at["route"]] == [router] * (items - 1) + [router + norm]
    else:
        assert w[router[-1]] == seam + norm


def test_pack_converts_in_place_and_dense_reads_either_layout():
    from mono_kernels_minimax.ffn.weights import random_weights

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, 1, WeightFormat.MXFP4, seed=4)
    before = {n: w.dense(n) for n in ("w13", "w2")}
    raw13 = w.w13.clone()
    big = w.w2_scale.clone()
    big[0, 0, 0] = 192
    with pytest.raises(ValueError, match="w2_scale: e8m0 code 192"):
        replace(w, w2_scale=big).packed(True)
    assert torch.equal(w.w13, raw13), "refused before anything was converted"
    p = w.packed(True)
    assert p.rot
    assert p.w13 is w.w13 and not torch.equal(p.w13, raw13), "converted in place"
    for n in ("w13", "w2"):
        assert torch.equal(p.dense(n), before[n])
    assert p.packed(True) is p
    with pytest.raises(ValueError, match="already packed"):
        p.packed(False)


def test_pack_to_frag_converts_in_place_and_dense_reads_it():
    from mono_kernels_minimax.ffn.weights import random_weights

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, 2, WeightFormat.MXFP4, seed=5)  # TP 2: two scale bytes a w2 row
    before = {n: w.dense(n) for n in ("w13", "w2")}
    raw2 = w.w2.clone()
    assert w.expert_layout == "mxfp4-k32"
    p = w.packed(False, frag=True)
    assert p.frag and not p.rot and p.expert_layout == "mxfp4-frag"
    assert p.w2 is w.w2 and not torch.equal(p.w2, raw2), "converted in place"
    for n in ("w13", "w2"):
        assert torch.equal(p.dense(n), before[n])
    assert p.packed(False, frag=True) is p
    with pytest.raises(
        ValueError, match="already packed as mxfp4-frag; the kernel wants mxfp4-rot"
    ):
        p.packed(True)
    assert FfnBuild(cfg, 1, 2, WeightFormat.MXFP4, frag=True).layout == "mxfp4-frag"
    assert FfnBuild(cfg, 1, 1, WeightFormat.FP8, frag=True).layout == "fp8-frag"
    with pytest.raises(ValueError, match="packed MXFP4 or FP8 experts only"):
        FfnBuild(cfg, 1, 1, WeightFormat.BF16, frag=True)


def test_fp8_packs_to_frag_in_place_and_dense_reads_it():
    """The Gluon build's FP8: all four matrices move into fp8-frag in their own storage,
    scales untouched, and dense() reads them as before; packing is one way."""
    from mono_kernels_minimax.ffn.weights import random_weights

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, 1, WeightFormat.FP8, seed=6)
    names = ("w13", "w2", "shared_w13", "shared_w2")
    before = {n: w.dense(n) for n in names}
    raw = {n: getattr(w, n).view(torch.uint8).clone() for n in names}
    assert w.expert_layout == "fp8-b128" and w.packed(False) is w
    p = w.packed(False, frag=True)
    assert p.frag and p.expert_layout == "fp8-frag"
    for n in names:
        assert getattr(p, n) is getattr(w, n), f"{n}: converted in place"
        assert not torch.equal(getattr(p, n).view(torch.uint8), raw[n]), n
        assert torch.equal(p.dense(n), before[n]), n
    assert p.w13_scale is w.w13_scale
    assert p.packed(False, frag=True) is p
    with pytest.raises(ValueError, match="already packed as fp8-frag; the kernel wants fp8-b128"):
        p.packed(False)


def test_stage_inputs_cover_the_waits():
    """Every done pair an item waits for (`waits`) is a ticket of one of its stage's
    `INPUTS`, or stands for such tickets: a slot's pair for up items, the route's for the
    router or route items that built the table (`timeline.stage_deps` over a launch)."""
    from mono_kernels_minimax.ffn.spec import INPUTS, route_done, stage_bounds, waits

    b = FfnBuild(MiniMaxM3Config.tiny(), 3, 1)
    nslots = b.max_slots
    stage = {t: name for name, lo, hi in stage_bounds(b, nslots, True) for t in range(lo, hi)}
    assert set(stage.values()) - {"push"} <= set(INPUTS)
    rows = [dict(ticket=t, stage=name) for t, name in stage.items()]
    deps = stage_deps(rows, INPUTS)
    for t, waited in waits(b, nslots, True).items():
        for w in waited:
            if w in stage:
                assert w in deps[t], (stage[t], t, w)
            elif w == route_done(b):
                assert {"router", "route"} & set(INPUTS[stage[t]]), stage[t]
            else:  # a slot's pair: its up items
                assert {"up", "shared-up"} & set(INPUTS[stage[t]]), stage[t]
