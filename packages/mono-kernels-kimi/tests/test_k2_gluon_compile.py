"""K2's Gluon build compiled for sm_90 on a CPU (Gluon has no interpreter; its GPU tests are
in test_k2_gpu.py): the binary is Gluon's (no ttir stage: the compile cache keeps the two
compilers apart), its weight streams are mma.sync loops without shared-memory stores of
decoded weights, and no ticket draw is broadcast from a split warp (stop 37's H200 fault:
a draw before the loop and one at its end split warp 0, and its warps worked different
items)."""

from __future__ import annotations

import json

import pytest
from mono_peer.testing import child_json


def facts() -> dict:
    from mono_kernels_kimi.k2 import triton_build
    from mono_kernels_kimi.k2.build import K2Gluon
    from mono_runtime.sass import loops, sass_of, split_broadcasts

    k = triton_build.compile_for(K2Gluon.example().key, "sm90")
    sass = sass_of(k)
    mma = [body for body in loops(sass) if any("HMMA" in line for line in body)]
    return {
        "gluon": "ttir" not in k.asm,
        "mma_loops": len(mma),
        "sts_in_mma_loops": sum(any(" STS" in line for line in body) for body in mma),
        "split": split_broadcasts(sass),
    }


@pytest.fixture(scope="module")
def got():
    return child_json([__file__], 380, TRITON_INTERPRET="0")[0]


@pytest.mark.timeout(400)
def test_k2_gluon_build_compiles_for_sm90(got):
    assert got["gluon"], "the compile cache returned the Triton build's binary"
    assert got["mma_loops"] >= 5, got  # o_proj, router/latent/shared, routed up, down, up_proj
    assert got["sts_in_mma_loops"] == 0, got


@pytest.mark.timeout(400)
def test_k2_gluon_ticket_draws_are_not_split(got):
    assert not got["split"], got


if __name__ == "__main__":
    print(json.dumps(facts()))
