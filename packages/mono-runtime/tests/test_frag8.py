"""The ``fp8-frag`` layout (pure torch) and the Gluon engine's FP8 stream: the layout and
the decode's bits against e4m3's own values on a CPU, the compiled sm_90 loop without a
GPU, and on an NVIDIA GPU (`-m gpu`) the GEMV against float64 (the two-block ring:
test_frag.py)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from mono_peer.testing import child_json
from mono_runtime.stream import layout as L
from mono_runtime.stream.frag8 import (
    decode_words,
    pack_experts_fp8_frag,
    pack_fp8_frag,
    unpack_experts_fp8_frag,
    unpack_fp8_frag,
)


def _e4m3(n, k, g, lead=()):
    """Random e4m3 values over every finite code (NaN codes 0x7F / 0xFF left out)."""
    b = torch.randint(0, 255, (*lead, n, k), generator=g, dtype=torch.uint8)
    b = torch.where((b & 0x7F) == 0x7F, b - 1, b)
    return b.view(torch.float8_e4m3fn)


def test_fp8_frag_round_trips_and_decodes_every_code_exactly():
    """Every finite e4m3 code (zeros, subnormals, both signs) decodes, through the device's
    bit operations (`decode_words`), to exactly its bf16 value, at the position the layout
    gives it."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # 254 finite codes
    g = torch.Generator().manual_seed(0)
    w = _e4m3(32, 256, g, lead=(2,))
    w.view(torch.uint8).view(-1)[: codes.numel()] = codes
    words = pack_fp8_frag(w)
    assert words.shape == (2, 2, 4, 256) and words.dtype == torch.int32
    assert torch.equal(unpack_fp8_frag(words).view(torch.uint8), w.view(torch.uint8))
    got = decode_words(words)
    assert torch.equal(got.view(torch.int16), w.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(L.dequantize(words[1], torch.ones(1, 2), L.FP8_FRAG), w[1].float())


def test_fp8_frag_word_holds_its_lanes_fragment():
    """The contract the kernel's reshape relies on: block (R, c)'s word 128 jh + 4 lane +
    2 jl + h of lane (g, t) holds bytes (row g, col), (row g + 8, col), (row g, col + 1),
    (row g + 8, col + 1) of column col = 64 c + 16 (2 jh + jl) + 8 h + 2 t."""
    g = torch.Generator().manual_seed(1)
    w = _e4m3(32, 128, g)
    b = w.view(torch.uint8)
    words = pack_fp8_frag(w)
    for R, c, lane, jh, jl, h in [(0, 0, 0, 0, 0, 0), (1, 1, 31, 1, 1, 1), (0, 1, 13, 1, 0, 1)]:
        word = int(words[R, c, 128 * jh + 4 * lane + 2 * jl + h]) & 0xFFFFFFFF
        gg, t = divmod(lane, 4)
        col = 64 * c + 16 * (2 * jh + jl) + 8 * h + 2 * t
        r = 16 * R + gg
        want = [b[r, col], b[r + 8, col], b[r, col + 1], b[r + 8, col + 1]]
        assert list(word.to_bytes(4, "little")) == [int(v) for v in want]


def test_fp8_frag_packs_in_place_all_or_none_and_refuses_by_name():
    g = torch.Generator().manual_seed(3)
    w13, w2 = _e4m3(64, 128, g, lead=(3,)), _e4m3(128, 64, g, lead=(3,))
    keep = [t.clone() for t in (w13, w2)]
    ptrs = [t.data_ptr() for t in (w13, w2)]
    bad = w2.clone()
    bad.view(torch.uint8)[1, 5, 0] = 0xFF
    with pytest.raises(ValueError, match="weights.w2: .*NaN"):
        pack_experts_fp8_frag({"w13": w13, "w2": bad})
    assert torch.equal(w13.view(torch.uint8), keep[0].view(torch.uint8)), "refused first"
    pack_experts_fp8_frag({"w13": w13, "w2": w2})
    assert [t.data_ptr() for t in (w13, w2)] == ptrs and w13.dtype == torch.float8_e4m3fn
    assert torch.equal(w2.view(-1).view(torch.int32), pack_fp8_frag(keep[1]).view(-1))
    for v, v0 in zip((w13, w2), keep, strict=True):
        assert torch.equal(unpack_experts_fp8_frag(v).view(torch.uint8), v0.view(torch.uint8))
    with pytest.raises(ValueError, match="blocks of 16"):
        pack_fp8_frag(keep[0][0, :8])
    with pytest.raises(ValueError, match="blocks of 64"):
        pack_fp8_frag(keep[0][0, :, :32])
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        pack_fp8_frag(torch.zeros(16, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="int32"):
        unpack_fp8_frag(torch.zeros(1, 1, 128, dtype=torch.int32))
    from mono_runtime.stream.gemv import GemvTiles, gemv

    with pytest.raises(ValueError, match="fp8-frag needs bn <= 128"):
        GemvTiles(bn=256, bk=128, stages=2).check(L.FP8_FRAG, 256, 128)
    with pytest.raises(ValueError, match="NVIDIA GPU"):
        words = pack_fp8_frag(keep[0][0])
        gemv(words, torch.ones(1, 1), torch.zeros(1, 128, dtype=torch.bfloat16), L.FP8_FRAG,
             GemvTiles(bn=64, bk=64, stages=2))  # fmt: skip


def fp8_loop_cost() -> dict:
    """The sm_90 hot loop of the FP8 GEMV at the chosen tiles (child process: the compile
    needs TRITON_INTERPRET unset)."""
    from mono_runtime.compile_check import compile_for, resources_of
    from mono_runtime.sass import loop_cost
    from mono_runtime.stream.bench import CHOSEN
    from mono_runtime.stream.frag_gluon import frag_gemv_kernel

    t = CHOSEN[L.FP8_FRAG]
    types = {"w": "*i32", "ws": "*fp32", "x": "*bf16", "y": "*fp32", "S": "i32"}
    consts = dict(N=16384, K=8192, PT=16, BN=t.bn, BK=t.bk, SPLIT=t.split, STAGES=t.stages,
                  W=t.warps, NT=8, F=2)  # fmt: skip
    k = compile_for(frag_gemv_kernel, types, consts, num_warps=t.warps)
    cost = loop_cost(k, t.bn * t.bk)
    return {"per_value": cost.per_value, "ops": cost.opcodes, "res": resources_of(k).__dict__}


@pytest.mark.timeout(300)
def test_fp8_loop_decodes_in_registers():
    """sm_90 SASS: the FP8 loop decodes into mma.sync's registers (HMMA, no wgmma, no
    shared-memory round trip of the decoded tile), spills nothing, and costs at most 0.125
    warp-instructions a value (triton 3.6: 0.117; mxfp4-frag: 0.078 a value, 0.155 a
    byte)."""
    got, _ = child_json([__file__, "costs"], 280, TRITON_INTERPRET="0")
    ops, res = got["ops"], got["res"]
    assert ops.get("HMMA", 0) > 0 and "HGMMA" not in ops and "STS" not in ops, ops
    assert ops.get("HMUL2", 0) > 0, ops  # the 2^120 lift, in registers
    assert res["spill_bytes"] == 0, res
    assert got["per_value"] <= 0.125, got


def _gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Gluon engine's builds serve sm_90+")


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("s", [1, 3, 9, 16])
def test_fp8_gemv_matches_float64_on_the_gpu(s):
    """The FP8 GEMV against float64 on the dequantized weight, with scales that differ by
    block (a half step's scale must be its own block's)."""
    from mono_runtime.stream.gemv import GemvTiles, gemv

    _gpu()
    g = torch.Generator().manual_seed(s)
    n, k = 256, 1024
    w = _e4m3(n, k, g)
    scales = torch.rand(n // 128, k // 128, generator=g) * 0.01 + 0.001
    x = torch.randn(s, k, generator=g).to(torch.bfloat16)
    dense = L.dequantize(w, scales, L.FP8_B128).double()
    ref = x.double() @ dense.T
    terms = x.double().abs() @ dense.abs().T
    words, sc = pack_fp8_frag(w).cuda(), scales.cuda()
    for tiles in (
        GemvTiles(64, 128, 2, 2, 4),
        GemvTiles(128, 256, 2, 3, 8),  # two K steps a part: Gluon's ring needs >= 2
        GemvTiles(64, 64, 1, 3, 4),
    ):
        y = gemv(words, sc, x.cuda(), L.FP8_FRAG, tiles).double().cpu()
        assert y.shape == (s, n)
        assert ((y - ref).abs() <= 1e-5 * terms).all(), tiles


if __name__ == "__main__":
    if sys.argv[1] == "costs":
        print(json.dumps(fp8_loop_cost()))
