"""The FFN's compiled expert streams stay as cheap as the engine's GEMV (sm_90 SASS, no GPU):
the packed MXFP4 decode must not fall back to a shared-memory round trip or byte repacking
inside the persistent kernel, where register pressure could push it there, and no dot loop
loads global memory 1-2 bytes at a time (at real shapes: a tiny build's one-group scale
tiles are single bytes)."""

from __future__ import annotations

import json

import pytest
from mono_peer.testing import child_json


def costs() -> dict:
    """(warp-instructions per value, opcodes) of each innermost loop feeding wgmmas, and
    each dot loop's narrow loads, of the real TP4 rank's MXFP4 build at S = 1."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn import triton_build
    from mono_kernels_minimax.ffn.spec import FfnBuild
    from mono_runtime.sass import loop_cost, loops, narrow_stream_loads, sass_of, wgmma_values

    k = triton_build.compile_for(FfnBuild(MiniMaxM3Config(), 1, 4), "sm90")
    sass = sass_of(k)
    out = []
    for body in loops(sass):
        if wgmma_values(body, k.metadata.num_warps):
            c = loop_cost(k, body=body)
            out.append((c.per_value, c.opcodes))
    return {"costs": out, "narrow": narrow_stream_loads(sass)}


@pytest.mark.timeout(400)
def test_mxfp4_expert_streams_are_cheap():
    facts, _ = child_json([__file__], 380, TRITON_INTERPRET="0")
    found = facts["costs"]
    assert not any(facts["narrow"]), f"dot loops load 1-2 bytes at a time: {facts['narrow']}"
    mxfp4 = [(v, ops) for v, ops in found if ops.get("HMUL2")]  # the decoding loops
    assert len(mxfp4) >= 2, found  # up (gate + up rows) and down
    for per_value, ops in mxfp4:
        assert per_value <= 0.11 and "STS" not in ops, (per_value, ops)


if __name__ == "__main__":
    print(json.dumps(costs()))
