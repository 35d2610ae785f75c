"""The ``mxfp4-frag`` layout (pure torch) and its Gluon engine: the layout against the
checkpoint's codes and the decode's bit contract on a CPU, the compiled sm_90 loop's cost
without a GPU, and on an NVIDIA GPU (`-m gpu`) the GEMV against float64, the two-block
ring (`frag_stream_row_pair` and its bf16 and fp8 twins) against two rings and the grouped
ring (`frag_stream_experts`) against float64."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import triton
import triton.language as tl
from mono_peer.testing import child_json
from mono_runtime import decode_triton as dt
from mono_runtime import lang as lg
from mono_runtime.stream import frag_gluon as fg
from mono_runtime.stream import layout as L
from mono_runtime.stream.frag import (
    pack_experts_frag,
    pack_mxfp4_frag,
    unpack_experts_frag,
    unpack_mxfp4_frag,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


def _k32(n, k, g, lead=()):
    codes = torch.randint(0, 256, (*lead, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 140, (*lead, n, k // 32), generator=g, dtype=torch.uint8)
    scales.view(-1)[:2] = torch.tensor([58, L.ROT_SCALE_MAX], dtype=torch.uint8)
    return codes, scales


def test_frag_layout_round_trips_and_dequantizes_as_the_checkpoint():
    g = torch.Generator().manual_seed(0)
    codes, scales = _k32(48, 192, g, lead=(3,))
    words, sw = pack_mxfp4_frag(codes, scales, rows_per_pass=32)  # passes cut matrices
    assert words.shape == (3, 3, 3, 128) and words.dtype == torch.int32
    assert sw.shape == (3, 3, 3, 8) and sw.dtype == torch.int32
    back = unpack_mxfp4_frag(words, sw)
    assert torch.equal(back[0], codes) and torch.equal(back[1], scales)
    assert torch.equal(
        L.dequantize(words[1], sw[1], L.MXFP4_FRAG), L.dequantize(codes[1], scales[1], L.MXFP4_K32)
    )


def test_frag_packs_stacked_experts_in_place_all_or_none():
    """A bundle's experts convert in their own storage (a TP shard's narrow scale rows
    included: K = 64 is two scale bytes a row), and a bad tensor leaves every one as it
    was."""
    g = torch.Generator().manual_seed(3)
    w13, s13 = _k32(32, 128, g, lead=(3,))
    w2, s2 = _k32(128, 64, g, lead=(3,))
    keep = [t.clone() for t in (w13, s13, w2, s2)]
    ptrs = [t.data_ptr() for t in (w13, s13, w2, s2)]
    bad = s2.clone()
    bad[1, 5, 0] = L.ROT_SCALE_MAX + 1
    with pytest.raises(ValueError, match="weights.w2: .*e8m0 code"):
        pack_experts_frag({"w13": (w13, s13), "w2": (w2, bad)})
    assert torch.equal(w13, keep[0]) and torch.equal(s13, keep[1])
    pack_experts_frag({"w13": (w13, s13), "w2": (w2, s2)})
    assert [t.data_ptr() for t in (w13, s13, w2, s2)] == ptrs
    words, sw = pack_mxfp4_frag(keep[2], keep[3])
    assert torch.equal(w2.view(-1).view(torch.int32), words.view(-1))
    assert torch.equal(s2.view(-1).view(torch.int32), sw.view(-1))
    for (v, sc), (v0, s0) in zip([(w13, s13), (w2, s2)], [keep[:2], keep[2:]], strict=True):
        back = unpack_experts_frag(v, sc)
        assert torch.equal(back[0], v0) and torch.equal(back[1], s0)


def test_frag_word_holds_its_lanes_fragment():
    """The contract the kernel's reshape relies on: lane (g, t)'s word j of block (R, c),
    decoded as mxfp4-rot output i (layout.SOURCE_BITS), is the code at row 16 R + g +
    8 (i % 2), column 64 c + 16 j + 8 (i // 2) + 2 t + lane half; its scale word holds
    rows g and g + 8 of the block's two groups."""
    g = torch.Generator().manual_seed(1)
    codes, scales = _k32(32, 128, g)
    words, sw = pack_mxfp4_frag(codes, scales)
    full = torch.stack((codes & 15, codes >> 4), -1).reshape(32, 128)
    src = L.SOURCE_BITS
    for R, c, lane, j in [(0, 0, 0, 0), (1, 1, 31, 3), (0, 1, 13, 2), (1, 0, 6, 1)]:
        word = int(words[R, c, 4 * lane + j]) & 0xFFFFFFFF
        gg, t = divmod(lane, 4)
        for i in range(4):
            for h in range(2):
                code = sum(((word >> int(src[i, h, b])) & 1) << b for b in range(4))
                assert (
                    code
                    == full[16 * R + gg + 8 * (i % 2), 64 * c + 16 * j + 8 * (i // 2) + 2 * t + h]
                )
        got = list((int(sw[R, c, gg]) & 0xFFFFFFFF).to_bytes(4, "little"))
        rows = (16 * R + gg, 16 * R + gg + 8)
        want = [int(scales[r, 2 * c + grp]) for grp in (0, 1) for r in rows]
        assert got == want


def test_frag_refuses_bad_input_by_name():
    g = torch.Generator().manual_seed(2)
    codes, scales = _k32(16, 128, g)
    with pytest.raises(ValueError, match="blocks of 16"):
        pack_mxfp4_frag(codes[:8], scales[:8])
    with pytest.raises(ValueError, match="blocks of 64"):
        pack_mxfp4_frag(codes[:, :16], scales[:, :1])
    with pytest.raises(ValueError, match="scales:"):
        pack_mxfp4_frag(codes, scales[:, :2])
    bad = scales.clone()
    bad[3, 1] = L.ROT_SCALE_MAX + 1
    with pytest.raises(ValueError, match="e8m0 code 192"):
        pack_mxfp4_frag(codes, bad)
    words, sw = pack_mxfp4_frag(codes, scales)
    with pytest.raises(ValueError, match="scale_words"):
        unpack_mxfp4_frag(words, sw[..., :4])
    from mono_runtime.stream.gemv import GemvTiles, gemv

    codes, scales = _k32(64, 128, g)
    words, sw = pack_mxfp4_frag(codes, scales)
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="NVIDIA GPU"):
        gemv(words, sw, x, L.MXFP4_FRAG, GemvTiles(bn=64, bk=64, split=1, stages=2))
    with pytest.raises(ValueError, match="mxfp4-frag needs 4 or 8 warps"):
        GemvTiles(bn=64, bk=96, stages=2).check(L.MXFP4_FRAG, 64, 192)


def frag_loop_cost() -> dict:
    """The sm_90 hot loops of both MXFP4 engines at the chosen tiles (child process: the
    compile needs TRITON_INTERPRET unset)."""
    from mono_runtime.compile_check import compile_for, resources_of
    from mono_runtime.sass import loop_cost
    from mono_runtime.stream.bench import CHOSEN
    from mono_runtime.stream.frag_gluon import frag_gemv_kernel
    from mono_runtime.stream.gemv import gemv_kernel

    t = CHOSEN[L.MXFP4_FRAG]
    types = {"w": "*i32", "ws": "*i32", "x": "*bf16", "y": "*fp32", "S": "i32"}
    consts = dict(N=16384, K=8192, PT=16, BN=t.bn, BK=t.bk, SPLIT=t.split, STAGES=t.stages,
                  W=t.warps, NT=8, F=1)  # fmt: skip
    k = compile_for(frag_gemv_kernel, types, consts, num_warps=t.warps)
    frag = loop_cost(k, t.bn * t.bk)
    r = CHOSEN[L.MXFP4_ROT]
    types = {"w": "*u8", "ws": "*u8", "x": "*bf16", "y": "*fp32"}
    consts = dict(N=16384, KROW=8192, S=1, BN=r.bn, BK=r.bk, SPLIT=r.split,
                  FMT=int(L.MXFP4_ROT), STAGES=r.stages, CPU=False, ASM=True)  # fmt: skip
    rot = loop_cost(compile_for(gemv_kernel, types, consts), r.bn * r.bk)
    return {"frag": [frag.per_value, frag.opcodes, resources_of(k).__dict__], "rot": rot.per_value}


@pytest.mark.timeout(300)
def test_frag_loop_is_cheaper_than_the_triton_engines():
    """sm_90 SASS: the Gluon loop decodes into mma.sync's registers (HMMA, no wgmma, no
    shared-memory round trip of the decoded tile), spills nothing, and spends fewer
    instructions a value than the Triton mxfp4-rot loop (Triton 3.8, the chosen tiles:
    0.077 against 0.091 warp-instructions; with 128-row tiles 0.071 against 0.101)."""
    costs, _ = child_json([__file__, "costs"], 280, TRITON_INTERPRET="0")
    per_value, ops, res = costs["frag"]
    assert ops.get("HMMA", 0) > 0 and "HGMMA" not in ops and "STS" not in ops, ops
    assert res["spill_bytes"] == 0, res
    assert per_value <= 0.08 and per_value < 0.9 * costs["rot"], costs


def pair_ring_cost() -> dict:
    """The sm_90 code of the two-block ring at the FFN's up tile (64 + 64 rows, K steps of
    256, 3 stages) beside two one-block rings (child process: TRITON_INTERPRET unset)."""
    from mono_runtime.compile_check import compile_for, resources_of
    from mono_runtime.sass import loops, sass_of

    types = {"w": "*i32", "ws": "*i32", "x": "*bf16", "y": "*fp32", "S": "i32"}
    types.update(row_a="i32", row_b="i32")
    out = {}
    for one_ring in (True, False):
        consts = dict(K=6144, BN=64, BK=256, F=1, ONE_RING=one_ring)
        k = compile_for(_pair_kernel, types, consts, num_warps=4)
        mma = [b for b in loops(sass_of(k)) if any("HMMA" in line for line in b)]
        out[str(one_ring)] = {
            "loops": [len(b) for b in mma],
            "sts": sum(any(" STS" in line for line in b) for b in mma),
            "spills": resources_of(k).spill_bytes,
        }
    return out


@pytest.mark.timeout(300)
def test_frag_row_pair_is_one_loop_without_spills():
    """sm_90: the two-block ring is one mma.sync loop (two one-block rings: two), no
    shared-memory round trip of the decoded tile, no spills, and fewer instructions a
    trip than the two loops together."""
    got, _ = child_json([__file__, "pair"], 280, TRITON_INTERPRET="0")
    one, two = got["True"], got["False"]
    assert len(one["loops"]) == 1 and len(two["loops"]) == 2, got
    assert one["sts"] == 0 and one["spills"] == 0, got
    assert one["loops"][0] < sum(two["loops"]), got


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("s", [1, 3, 8, 9, 16])
def test_frag_gemv_matches_float64_on_the_gpu(s):
    from mono_runtime.stream.gemv import GemvTiles, gemv

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync bf16 needs sm_80+")
    g = torch.Generator().manual_seed(s)
    codes, scales = _k32(256, 1024, g)
    x = torch.randn(s, 1024, generator=g).to(torch.bfloat16)
    dense = L.dequantize(codes, scales, L.MXFP4_K32).double()
    ref = x.double() @ dense.T
    terms = x.double().abs() @ dense.abs().T
    words, sw = (t.cuda() for t in pack_mxfp4_frag(codes, scales))
    for tiles in (
        GemvTiles(64, 256, 2, 2, 4),
        GemvTiles(128, 128, 4, 3, 8),
        GemvTiles(64, 512, 1, 2, 4),
    ):
        y = gemv(words, sw, x.cuda(), L.MXFP4_FRAG, tiles).double().cpu()
        assert y.shape == (s, 256)
        assert ((y - ref).abs() <= 1e-5 * terms).all(), tiles


@gluon.jit
def _store_two(y, a, b, BN: gl.constexpr):
    """y[0] = a, y[1] = b: two streams' fp32 [BN, 16] results in their mma.sync layout."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8]
    )
    n = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    t = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(y + n[:, None] * 16 + t[None, :], a)
    gl.store(y + BN * 16 + n[:, None] * 16 + t[None, :], b)


@gluon.jit
def _pair_kernel(
    w,
    ws,
    x,
    y,
    S,
    row_a,
    row_b,
    K: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    F: gl.constexpr,
    ONE_RING: gl.constexpr,
):
    """y[0], y[1] (fp32 [BN, 16]) = rows row_a.. and row_b.. of W (F: 0 bf16, 1 mxfp4-frag,
    2 fp8-frag) times x, by one ring of both blocks (ONE_RING) or one ring each."""
    if ONE_RING:
        if F == 1:
            a, b = fg.frag_stream_row_pair(
                w, ws, x, S, row_a, row_b, 0, K // BK, K, BN, BK, 3, 4, 16
            )
        elif F == 2:
            a, b = fg.fp8_stream_row_pair(
                w, ws, x, S, row_a, row_b, 0, K // BK, K, BN, BK, 3, 4, 16
            )
        else:
            a, b = fg.bf16_stream_row_pair(w, x, S, row_a, row_b, 0, K // BK, K, BN, BK, 3, 4, 16)
    else:
        if F == 1:
            a = fg.frag_stream_rows(w, ws, x, S, row_a, 0, K // BK, K, BN, BK, 3, 4, 16)
            b = fg.frag_stream_rows(w, ws, x, S, row_b, 0, K // BK, K, BN, BK, 3, 4, 16)
        elif F == 2:
            a = fg.fp8_stream_rows(w, ws, x, S, row_a, 0, K // BK, K, BN, BK, 3, 4, 16)
            b = fg.fp8_stream_rows(w, ws, x, S, row_b, 0, K // BK, K, BN, BK, 3, 4, 16)
        else:
            a = fg.bf16_stream_rows(w, x, S, row_a, 0, K // BK, K, BN, BK, 3, 4, 16)
            b = fg.bf16_stream_rows(w, x, S, row_b, 0, K // BK, K, BN, BK, 3, 4, 16)
    _store_two(y, a, b, BN)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("f", [1, 0, 2], ids=["mxfp4", "bf16", "fp8"])
def test_frag_row_pair_is_two_rings_in_one_on_the_gpu(f):
    """frag_stream_row_pair / bf16_stream_row_pair / fp8_stream_row_pair (a gate block and
    its up block in one ring; FP8's in different scale blocks) give, bit for bit, what two
    rings give."""
    from mono_runtime.stream.frag8 import pack_fp8_frag

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync bf16 needs sm_80+")
    g = torch.Generator().manual_seed(7)
    n, k, s = 384, 1024, 3
    x = torch.randn(s, k, generator=g).to(torch.bfloat16).cuda()
    if f == 1:
        codes, scales = _k32(n, k, g)
        w, ws = (t.cuda() for t in pack_mxfp4_frag(codes, scales))
    elif f == 2:
        w = pack_fp8_frag(torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)).cuda()
        ws = (torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001).cuda()
    else:
        w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).cuda()
        ws = w
    cases = [(64, 256, (0, 192)), (128, 64, (128, 0))]  # frag pairs: blocks of >= 64 rows
    for bn, bk, rows in [*cases, (32, 128, (64, 320))] if f == 0 else cases:
        got = []
        for one_ring in (True, False):
            y = torch.full((2, bn, 16), float("nan"), device="cuda")
            _pair_kernel[(1,)](w, ws, x, y, s, *rows, k, bn, bk, f, one_ring, num_warps=4)
            got.append(y[:, :, :s].cpu())
        assert torch.equal(got[0], got[1]), (bn, bk, rows)
        assert got[0].isfinite().all() and got[0].abs().sum() > 0, (bn, bk, rows)


@gluon.jit
def _asked_kernel(
    w, x, y, S, row0, K: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, ST: gl.constexpr
):
    """y[0] = rows row0.. of W times x by `bf16_stream_rows`; y[1] the same by
    `bf16_rows_ask` then `bf16_stream_asked` with an ST-deep ring of x (fp32 [BN, 16])."""
    a = fg.bf16_stream_rows(w, x, S, row0, 0, K // BK, K, BN, BK, 3, 4, 16)
    wpre = fg.bf16_rows_ask(w, row0, 0, K // BK, K, BN, BK, 4)
    b = fg.bf16_stream_asked(wpre, x, S, 0, K // BK, K, BN, BK, ST, 4, 16)
    _store_two(y, a, b, BN)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_asked_rows_are_the_ring_on_the_gpu():
    """bf16 rows asked into shared memory before their activations exist (`bf16_rows_ask`,
    K2's router with tile `rres`), then streamed (`bf16_stream_asked`), give bit for bit
    what `bf16_stream_rows` gives: every step's rows, the ring of x 2 or 8 deep."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync bf16 needs sm_80+")
    g = torch.Generator().manual_seed(11)
    n, k = 64, 1792
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).cuda()
    for s, st in ((1, 3), (16, 8)):
        x = torch.randn(s, k, generator=g).to(torch.bfloat16).cuda()
        y = torch.full((2, 16, 16), float("nan"), device="cuda")
        _asked_kernel[(1,)](w, x, y, s, 32, k, 16, 128, st, num_warps=4)
        got = y[:, :, :s].cpu()
        assert torch.equal(got[0], got[1]), (s, st)
        ref = w[32:48].double().cpu() @ x.double().cpu().T
        assert torch.allclose(got[0].double(), ref, rtol=1e-2, atol=1e-2), (s, st)


@triton.jit
def _pairs_body(
    w, ws, x, y, S, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr
):
    """y[16 tokens, BN / 2] (int32 bf16 pairs) = `tile_pairs` of rows 0..BN of W times x, as
    K2's o_proj items push their result: the stream's sums straight into pairs."""
    row0 = tl.program_id(0) * 0  # a runtime row, as a kernel's items have
    acc = dt.any_stream_rows(
        w, ws, x, row0, 0, K // BK, K, BN, BK, S, 1 if MX else 0, 3, False, True
    )
    pairs = dt.tile_pairs(acc, BN)
    t = lg.arange(0, 16)[:, None]
    q = lg.arange(0, BN // 2)[None, :]
    tl.store(lg.like(y + t * (BN // 2) + q, pairs), pairs, mask=lg.like((t < S) & (q >= 0), pairs))


_pairs_gluon = gluon.jit(_pairs_body.fn)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mx", [False, True])
def test_tile_pairs_of_a_gluon_stream_on_the_gpu(mx):
    """A Gluon stream's result made into bf16 pairs (`tile_pairs`, as K2's o_proj items
    push it) holds the sums, every pair of every live row written, whatever an earlier
    launch left in shared memory (a ring of scale words)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync bf16 needs sm_80+")
    g = torch.Generator().manual_seed(11)
    k, s = 1024, 1
    codes, scales = _k32(128, k, g)
    fw, fws = (t.cuda() for t in pack_mxfp4_frag(codes, scales))
    x = torch.randn(4, k, generator=g).to(torch.bfloat16).cuda()
    if mx:
        w, ws = fw, fws
        ref = L.dequantize(codes, scales, L.MXFP4_K32).double()
    else:
        ref = torch.randn(128, k, generator=g) * 0.05
        w = ref.to(torch.bfloat16).cuda()
        ws = w
        ref = w.double().cpu()
    want = (x[:s].double().cpu() @ ref.T).float()
    for bn, bk in ((64, 128), (16, 128), (128, 256)):
        # an MXFP4 ring first, on every SM: its scale words stay in shared memory
        _pairs_gluon[(264,)](
            fw,
            fws,
            x,
            torch.empty(16, 64, dtype=torch.int32, device="cuda"),
            4,
            k,
            128,
            256,
            True,
            num_warps=4,
        )
        y = torch.zeros(16, bn // 2, dtype=torch.int32, device="cuda")
        _pairs_gluon[(1,)](w, ws, x, y, s, k, bn, bk, mx, num_warps=4)
        got = y[:s].cpu().view(torch.bfloat16).float()
        assert (y[:s] != 0).all(), (bn, bk, "pairs left unwritten", (y[:s] == 0).nonzero().tolist())
        err = ((got - want[:, :bn]).norm() / want[:, :bn].norm()).item()
        assert err < 1e-2, (bn, bk, err, got[0, :8].tolist(), want[0, :8].tolist())


if __name__ == "__main__":
    if sys.argv[1] == "costs":
        print(json.dumps(frag_loop_cost()))
    if sys.argv[1] == "pair":
        print(json.dumps(pair_ring_cost()))


@gluon.jit
def _experts_kernel(
    w, ws, x, eids, wt, y, nj, S: gl.constexpr, K: gl.constexpr, N: gl.constexpr,
    BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """y[16 tokens, BN] = rows pid x BN.. of `frag_stream_experts` over nj experts."""
    r0 = gl.program_id(0) * BN
    acc = fg.frag_stream_experts(
        w, ws, x, S, eids, wt, nj, r0, K // BK, K, N, BN, BK, STAGES, 4, 16
    )
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8]
    )
    on = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    ot = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(y + ot[None, :] * N + r0 + on[:, None], acc, mask=(ot < S)[None, :])


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("s", "nj"), [(1, 1), (4, 3), (16, 4)])
def test_frag_stream_experts_is_the_weighted_sum_of_gemvs_on_the_gpu(s, nj):
    """The grouped GEMV (one ring over nj stacked experts, each with its own activation
    rows and per-token weight; a weight of 0 adds 0 even where that expert's sums are
    NaN) against float64, with the experts picked out of order from a stack of 6."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("mma.sync bf16 needs sm_80+")
    g = torch.Generator().manual_seed(20 + s)
    e, n, k = 6, 256, 768
    codes, scales = _k32(n, k, g, (e,))
    dense = L.dequantize(codes, scales, L.MXFP4_K32).double()
    x = torch.randn(nj, s, k, generator=g).to(torch.bfloat16)
    ids = torch.tensor([4, 1, 5, 0][:nj], dtype=torch.int32)
    wt = torch.rand(nj, s, generator=g)
    wt[0, 0] = 0.0  # a row that does not use expert 4: its NaN activations add nothing
    x[0, 0, :7] = float("nan")
    ref = sum(
        wt[j].double()[:, None] * torch.nan_to_num(x[j].double() @ dense[int(ids[j])].T, nan=0.0)
        for j in range(nj)
    )
    terms = sum(
        wt[j].double()[:, None] * (x[j].double().abs().nan_to_num() @ dense[int(ids[j])].abs().T)
        for j in range(nj)
    )
    pack_experts_frag({"w": (codes, scales)})  # in place: codes and scales now hold frag words
    words, sw = codes.cuda(), scales.cuda()
    for bn, bk, stages in ((128, 256, 3), (64, 128, 2)):
        y = torch.full((16, n), float("nan"), device="cuda")
        _experts_kernel[(n // bn,)](
            words.view(torch.int32), sw.view(torch.int32), x.cuda(), ids.cuda(), wt.cuda(), y,
            nj, s, k, n, bn, bk, stages, num_warps=4,
        )  # fmt: skip
        got = y[:s].double().cpu()
        assert ((got - ref).abs() <= 1e-5 * terms + 1e-30).all(), (bn, bk, stages)
