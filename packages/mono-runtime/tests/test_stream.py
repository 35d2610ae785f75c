"""The weight-streaming engine under the Triton interpreter: every format's GEMV against
float64 on the dequantized weight, the packed MXFP4 layout's round trip, bad tiles."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from mono_runtime.stream import layout as L


def _weight(fmt, n, k, bk, g):
    if fmt == L.BF16:
        return torch.randn(n, k, generator=g).to(torch.bfloat16), None
    if fmt == L.FP8_B128:
        return torch.randn(n, k, generator=g).to(torch.float8_e4m3fn), torch.rand(
            -(-n // 128), k // 128, generator=g
        ) + 0.5
    codes = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    # scales across the exact range, including its ends (58 and 254)
    scales = torch.randint(100, 140, (n, k // 32), generator=g, dtype=torch.uint8)
    scales[0, 0], scales[1, 0] = 58, 150
    if fmt == L.MXFP4_SPLIT:
        return L.pack_mxfp4_split(codes, bk), scales
    return codes, scales


def check_gemv(fmt, bk, s):
    """Run in a child under TRITON_INTERPRET=1 (set per process: Triton reads it when a
    kernel is defined, so this process's other tests keep compiled kernels)."""
    from mono_runtime.stream.gemv import GemvTiles, gemv

    g = torch.Generator().manual_seed(bk + s)
    n, k = 128, 256
    w, ws = _weight(fmt, n, k, bk, g)
    x = torch.randn(s, k, generator=g).to(torch.bfloat16)
    ref = x.double() @ L.dequantize(w, ws, fmt, bk).double().T
    y = gemv(w, ws, x, fmt, GemvTiles(bn=64, bk=bk, split=2))
    assert y.shape == (s, n)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize(
    "fmt,bk",
    [
        (L.BF16, 128),
        (L.FP8_B128, 128),
        (L.MXFP4_SPLIT, 128),
        (L.MXFP4_SPLIT, 32),
        (L.MXFP4_K32, 64),
    ],
)
@pytest.mark.parametrize("s", [1, 5])
def test_gemv_matches_float64(fmt, bk, s):
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, __file__, str(int(fmt)), str(bk), str(s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_split_layout_round_trip_in_place():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (3, 5, 128), generator=g, dtype=torch.uint8)
    keep = codes.clone()
    for bk in (32, 64, 256):
        packed = L.pack_mxfp4_split(codes.clone(), bk)
        assert torch.equal(L.unpack_mxfp4_split(packed, bk), keep)
    same = L.pack_mxfp4_split(codes, 64, out=codes, rows_per_pass=2)
    assert same is codes and torch.equal(L.unpack_mxfp4_split(codes, 64), keep)
    # the split layout: byte j of a chunk holds k0 + j (low) and k0 + bk/2 + j (high)
    w = L.unpack_mxfp4_k32(keep, torch.full((3, 5, 8), 127, dtype=torch.uint8))
    lo = L.decode_e2m1(codes[..., :32] & 15)
    hi = L.decode_e2m1(codes[..., :32] >> 4)
    assert torch.equal(lo, w[..., :32]) and torch.equal(hi, w[..., 32:64])


def test_bad_tiles_and_layouts_are_refused():
    with pytest.raises(ValueError, match="bk=48"):
        L.pack_mxfp4_split(torch.zeros(2, 64, dtype=torch.uint8), 48)
    with pytest.raises(ValueError, match="not a multiple"):
        L.pack_mxfp4_split(torch.zeros(2, 48, dtype=torch.uint8), 64)
    with pytest.raises(ValueError, match="uint8"):
        L.pack_mxfp4_split(torch.zeros(2, 64), 64)
    from mono_runtime.stream.gemv import GemvTiles, gemv

    w = torch.zeros(128, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must divide"):
        gemv(w, None, torch.zeros(1, 256, dtype=torch.bfloat16), L.BF16, GemvTiles(bn=96))
    with pytest.raises(ValueError, match="S <= 16"):
        gemv(w, None, torch.zeros(17, 256, dtype=torch.bfloat16), L.BF16, GemvTiles(bn=64))
    with pytest.raises(ValueError, match="fp8-b128"):
        GemvTiles(bn=256, bk=128).check(L.FP8_B128, 256, 256)


if __name__ == "__main__":
    check_gemv(L.StreamFormat(int(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]))
