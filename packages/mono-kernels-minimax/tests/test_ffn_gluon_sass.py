"""The FFN's Gluon build compiled for sm_90 on a CPU (Gluon has no interpreter; its GPU
tests run in test_ffn_gpu.py), MXFP4 and FP8: every expert stream is the engine's mma.sync
loop (no shared-memory stores of decoded weights, no 1-2 byte loads), no ticket draw is
broadcast from a split warp, and registers are not spilled beyond a few words (S = 16: a
few dozen)."""

from __future__ import annotations

import json

import pytest
from mono_peer.testing import child_json


def facts() -> dict:
    """Per width: each mma.sync loop's opcodes, the split broadcasts, the narrow stream
    loads and the resources of the real TP4 rank's Gluon build."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn import triton_build
    from mono_kernels_minimax.ffn.spec import FfnBuild
    from mono_kernels_minimax.formats import WeightFormat
    from mono_runtime.compile_check import resources_of
    from mono_runtime.sass import loops, narrow_stream_loads, sass_of, split_broadcasts

    out = {}
    for fmt, rows in ((WeightFormat.MXFP4, 1), (WeightFormat.MXFP4, 16), (WeightFormat.FP8, 1),
                      (WeightFormat.FP8, 16)):  # fmt: skip
        b = FfnBuild(MiniMaxM3Config(), rows, 4, fmt, frag=True)
        k = triton_build.compile_for(b, "sm90")
        sass = sass_of(k)
        mma = [body for body in loops(sass) if any("HMMA" in line for line in body)]
        out[f"{fmt.value} {rows}"] = {
            "loops": [sorted({line.split()[0].split(".")[0] for line in b}) for b in mma],
            "split": split_broadcasts(sass),
            "narrow": narrow_stream_loads(sass),
            "resources": resources_of(k).__dict__,
        }
    return out


@pytest.mark.timeout(400)
def test_gluon_build_streams_on_the_mma_engine():
    got, _ = child_json([__file__], 380, TRITON_INTERPRET="0")
    for case, f in got.items():
        rows = case.split()[1]
        assert len(f["loops"]) >= 3, (case, f["loops"])  # frag up, down, shared
        for ops in f["loops"]:
            assert "STS" not in ops, (case, ops)
        assert not f["split"], f"{case}: ticket draws broadcast from a split warp"
        assert not any(f["narrow"]), (case, f["narrow"])
        # S = 16's tiles (one-ring pair, 128 down rows) spill 336 B (MXFP4, triton 3.6;
        # FP8 208 B), yet time 0.90x the spill-free ones on the H200 (spec.py's gluon_wide)
        spill_cap = 128 if rows == "1" else 384
        assert f["resources"]["spill_bytes"] <= spill_cap, (case, f["resources"])
        # two programs an SM (spec.py's occ=2): the deeper routed rings (tile ust) must not
        # grow the kernel's shared memory past half an SM's 227 KB
        assert f["resources"]["shared"] <= 113 * 1024, (case, f["resources"])


if __name__ == "__main__":
    print(json.dumps(facts()))
