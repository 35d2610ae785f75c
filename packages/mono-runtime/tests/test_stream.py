"""The weight-streaming engine under the Triton interpreter: every format's GEMV against
float64 on the dequantized weight, the packed MXFP4 layout's round trip, bad tiles."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from mono_peer.testing import child_json
from mono_runtime.stream import layout as L
from mono_runtime.stream.device import stream_row_pair


def _weight(fmt, n, k, bk, g):
    if fmt == L.BF16:
        return torch.randn(n, k, generator=g).to(torch.bfloat16), None
    if fmt == L.FP8_B128:
        return torch.randn(n, k, generator=g).to(torch.float8_e4m3fn), torch.rand(
            -(-n // 128), k // 128, generator=g
        ) + 0.5
    codes = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    # scales across the exact range, including its ends (58 and ROT_SCALE_MAX: the decode
    # has no clamp, so the largest code the packer admits must come out exact)
    scales = torch.randint(100, 140, (n, k // 32), generator=g, dtype=torch.uint8)
    scales[0, 0], scales[1, 0] = 58, L.ROT_SCALE_MAX
    if fmt == L.MXFP4_ROT:
        return L.pack_mxfp4_rot(codes, scales)
    return codes, scales


def check_gemv(fmt, bk, s):
    """Run in a child under TRITON_INTERPRET=1 (set per process: Triton reads it when a
    kernel is defined, so this process's other tests keep compiled kernels)."""
    from mono_runtime.stream.gemv import GemvTiles, gemv

    g = torch.Generator().manual_seed(bk + s)
    n, k = 128, 256
    w, ws = _weight(fmt, n, k, bk, g)
    x = torch.randn(s, k, generator=g).to(torch.bfloat16)
    dense = L.dequantize(w, ws, fmt).double()
    ref = x.double() @ dense.T
    y = gemv(w, ws, x, fmt, GemvTiles(bn=64, bk=bk, split=2))
    assert y.shape == (s, n)
    # each output against the size of its own terms: the 2^64-scaled row would hide every
    # other row's error in one norm
    terms = x.double().abs() @ dense.abs().T
    assert ((y.double() - ref).abs() <= 1e-5 * terms).all()
    # stream_row_pair: rows 64.. and 0.. in one loop (as one tile, then as two dots), each
    # its own stream_rows: as two dots bit for bit; as one tile within rounding, since the
    # interpreter's dot is numpy's matmul, whose summation order on some CPUs depends on
    # the operand's rows (128 here, 64 in stream_rows)
    one = gemv(w, ws, x, fmt, GemvTiles(bn=64, bk=bk, split=1))
    tol = 1e-6 * terms.float()
    for one_tile in (True, False):
        pair = torch.empty(2, max(16, triton.next_power_of_2(s)), 64)
        _pair_kernel[(1,)](
            w, w if ws is None else ws, x, pair, KROW=k, S=s, BN=64, BK=bk, FMT=int(fmt),
            CPU=True, ONE=one_tile,
        )  # fmt: skip
        got = torch.cat([pair[1, :s], pair[0, :s]], 1)
        if one_tile:
            assert ((got - one).abs() <= tol).all()
        else:
            assert torch.equal(got, one)


@triton.jit
def _pair_kernel(w, ws, x, y, KROW: tl.constexpr, S: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, FMT: tl.constexpr, CPU: tl.constexpr,
                 ONE: tl.constexpr):  # fmt: skip
    a, b = stream_row_pair(w, ws, x, BN, 0, 0, KROW // BK, KROW, BN, BK, S, FMT, 2, CPU, False,
                           ONE)  # fmt: skip
    n = tl.arange(0, BN)
    t = tl.arange(0, a.shape[1])
    tl.store(y + t[None, :] * BN + n[:, None], a)
    tl.store(y + a.shape[1] * BN + t[None, :] * BN + n[:, None], b)


GEMV_CASES = [
    (fmt, bk, s)
    for fmt, bk in [
        (L.BF16, 128),
        (L.FP8_B128, 128),
        (L.MXFP4_ROT, 128),
        (L.MXFP4_ROT, 32),
        (L.MXFP4_K32, 64),
    ]
    for s in (1, 5, 40)  # 40: 64 token rows in one pass, the last 24 masked
]


@pytest.mark.timeout(300)
def test_gemv_matches_float64():
    """Every (format, bk, S) case in one interpreter child: starting a child with torch and
    Triton costs more than a case."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    cases = ",".join(f"{int(fmt)}:{bk}:{s}" for fmt, bk, s in GEMV_CASES)
    run = subprocess.run(
        [sys.executable, __file__, "gemv", cases],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def _rotr(q: int, n: int) -> int:
    return ((q >> n) | (q << (32 - n))) & 0xFFFFFFFF


def _device_decode(word: int) -> list[tuple[int, int]]:
    """The PTX decode of one mxfp4-rot word, op for op (device._MX_ROT_PTX without the
    scale): four outputs of two 16-bit lanes, low lane first."""
    m = 0x81C081C0
    outs = [
        word & m,
        _rotr(word, 4) & m,
        _rotr(word, 10) & m,
        (_rotr(word, 14) & 0x00400040) | (_rotr(word, 6) & 0x81808180),
    ]
    return [(o & 0xFFFF, o >> 16) for o in outs]


def test_rot_layout_is_what_the_device_decode_reads():
    """Column 8 i + e of a group is lane e % 2 of output i of word e // 2, with the sign at
    bit 15 and the magnitude at bits 8..6 (bf16 of the value x 2^-126)."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (2, 64), generator=g, dtype=torch.uint8)  # k order
    k32 = codes[:, 0::2] | (codes[:, 1::2] << 4)
    rot = L.rotate_codes(k32)
    for row in range(2):
        for grp in range(2):
            raw = rot[row, grp * 16 : grp * 16 + 16].tolist()
            words = [int.from_bytes(bytes(raw[4 * w : 4 * w + 4]), "little") for w in range(4)]
            for i in range(4):
                for e in range(8):
                    lane = _device_decode(words[e // 2])[i][e % 2]
                    c = int(codes[row, grp * 32 + 8 * i + e])
                    assert lane == ((c & 8) << 12) | ((c & 7) << 6), (row, grp, i, e)
                    v = struct.unpack("<f", struct.pack("<I", lane << 16))[0] * 2.0**126
                    assert v == float(L.decode_e2m1(torch.tensor(c)))


def test_rot_layout_round_trip_in_place():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (3, 5, 128), generator=g, dtype=torch.uint8)
    keep = codes.clone()
    placed = L.rotate_codes(codes.clone())
    assert not torch.equal(placed, keep) and torch.equal(L.unrotate_codes(placed), keep)
    same = L.rotate_codes(codes, out=codes, rows_per_pass=2)
    assert same is codes and torch.equal(codes, placed)
    assert torch.equal(L.unrotate_codes(codes), keep)
    assert torch.equal(L.unrotate_codes(codes, rows_per_pass=4), keep)  # passes: 4, 4, 4, 3


def test_rot_layout_is_tile_major_and_packs_in_place():
    """Block b's group j holds rows 16 b .. 16 b + 15 of group j in one run (codes: 16
    bytes a row; scales: 1), matrix by matrix; packing in place rewrites the tensors given
    and unpacking restores both bit for bit."""
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 256, (2, 32, 64), generator=g, dtype=torch.uint8)  # 2 experts
    scales = torch.randint(100, 140, (2, 32, 4), generator=g, dtype=torch.uint8)
    keep, keep_s = codes.clone(), scales.clone()
    v, s = L.pack_mxfp4_rot(codes, scales, inplace=True)
    assert v is codes and s is scales
    placed = L.rotate_codes(keep)
    for e, b, j, r in ((0, 0, 0, 0), (0, 1, 3, 5), (1, 0, 2, 15), (1, 1, 1, 7)):
        run = (b * 4 + j) * 16 + r  # 16-byte runs (codes) / bytes (scales) from the start
        assert torch.equal(v[e].reshape(-1, 16)[run], placed[e, 16 * b + r, 16 * j : 16 * j + 16])
        assert s[e].reshape(-1)[run] == keep_s[e, 16 * b + r, j]
    back, back_s = L.unpack_mxfp4_rot(v, s)
    assert torch.equal(back, keep) and torch.equal(back_s, keep_s)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        L.pack_mxfp4_rot(keep[:, :8], keep_s[:, :8])
    with pytest.raises(ValueError, match="scales"):
        L.pack_mxfp4_rot(keep, keep_s[..., :2])
    big = keep_s.clone()
    big[1, 3, 0] = 200
    with pytest.raises(ValueError, match="w2_scale: e8m0 code 200"):
        L.pack_experts_rot({"w13": (keep.clone(), keep_s.clone()), "w2": (keep.clone(), big)})
    big[1, 3, 0] = L.ROT_SCALE_MAX + 1  # one past: the clamp-free decode would wrap its sign
    with pytest.raises(ValueError, match="scales: e8m0 code 192"):
        L.pack_mxfp4_rot(keep.clone(), big)
    few = {"w13": (keep.clone(), keep_s.clone()), "w2": (keep[:, :8].clone(), keep_s[:, :8])}
    with pytest.raises(ValueError, match="weights.w2: 8 rows"):
        L.pack_experts_rot(few)
    assert torch.equal(few["w13"][0], keep)  # all or none: w13 was left as it was


def gemv_loop_costs() -> dict:
    """Hot-loop cost of the sm_90 GEMV per format at the chosen tiles (child process: the
    compile needs TRITON_INTERPRET unset)."""
    from mono_runtime.compile_check import compile_for, resources_of
    from mono_runtime.sass import loop_cost
    from mono_runtime.stream.gemv import gemv_kernel

    out = {}
    for fmt, bn, bk in ((L.MXFP4_ROT, 128, 256), (L.MXFP4_K32, 64, 256)):
        types = {"w": "*u8", "ws": "*u8", "x": "*bf16", "y": "*fp32"}
        consts = dict(N=16384, KROW=8192, S=1, BN=bn, BK=bk, SPLIT=4, FMT=int(fmt), STAGES=4)
        k = compile_for(gemv_kernel, types, {**consts, "CPU": False, "ASM": True})
        cost = loop_cost(k, bn * bk)
        out[fmt.name] = (cost.per_value, cost.opcodes, resources_of(k).wgmma_serialized)
    return out


@pytest.mark.timeout(300)
def test_mxfp4_decode_is_cheap_in_the_compiled_loop():
    """sm_90 SASS of the GEMV: the mxfp4-rot loop stays near its 13 instructions per 8
    values and one shift-add a scale (0.079 warp-instructions per value with Triton 3.6;
    0.095 with the scale's clamps; 0.16-0.17 for the checkpoint layout through
    tl.dot_scaled), its decoded tile never goes through shared memory (no STS in the loop:
    the words are loaded into the dot operand), and ptxas keeps its wgmma pipelined (the
    loop is issue-bound: Nsight Compute on the H200, 0.70 warps issued a scheduler-cycle)."""
    costs, _ = child_json([__file__, "costs"], 280, TRITON_INTERPRET="0")
    rot, rot_ops, serialized = costs["MXFP4"]
    assert rot <= 0.085 and not serialized, costs
    assert "STS" not in rot_ops and rot_ops.get("HMUL2", 0) == 128 * 256 // 2 // 128, rot_ops
    assert rot < 0.7 * costs["MXFP4_K32"][0], costs


def test_bad_tiles_and_layouts_are_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        L.rotate_codes(torch.zeros(2, 24, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        L.rotate_codes(torch.zeros(2, 64))
    with pytest.raises(ValueError, match="out:"):
        L.rotate_codes(torch.zeros(2, 64, dtype=torch.uint8), out=torch.zeros(2, 32))
    from mono_runtime.stream.gemv import GemvTiles, gemv

    w = torch.zeros(128, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must divide"):
        gemv(w, None, torch.zeros(1, 256, dtype=torch.bfloat16), L.BF16, GemvTiles(bn=96))
    with pytest.raises(ValueError, match="S <= 64"):
        gemv(w, None, torch.zeros(65, 256, dtype=torch.bfloat16), L.BF16, GemvTiles(bn=64))
    x = torch.zeros(17, 256, dtype=torch.bfloat16)  # 17 rows: a 32-row stream
    with pytest.raises(ValueError, match=r"partials: expected fp32 \(1, 32, 128\)"):
        gemv(w, None, x, L.BF16, GemvTiles(bn=64), torch.empty(1, 16, 128))
    with pytest.raises(ValueError, match="fp8-b128"):
        GemvTiles(bn=256, bk=128).check(L.FP8_B128, 256, 256)
    with pytest.raises(ValueError, match="mxfp4-rot needs bn a multiple of 16"):
        GemvTiles(bn=8, bk=64).check(L.MXFP4_ROT, 64, 64)


if __name__ == "__main__":
    if sys.argv[1] == "costs":
        print(json.dumps(gemv_loop_costs()))
    else:
        for case in sys.argv[2].split(","):
            fmt, bk, s = (int(v) for v in case.split(":"))
            print(f"case {L.StreamFormat(fmt).name} bk={bk} S={s}", flush=True)
            check_gemv(L.StreamFormat(fmt), bk, s)


@pytest.mark.parametrize("shapes", ["1536", "1536x", "0x6144", "axb"])
def test_bench_refuses_bad_shapes_before_touching_a_gpu(shapes, capsys):
    from mono_runtime.stream.bench import main

    with pytest.raises(SystemExit) as e:
        main(["--shapes", shapes])
    assert e.value.code == 2
    assert "--shapes" in capsys.readouterr().err
