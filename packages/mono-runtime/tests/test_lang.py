"""mono_runtime.lang: one `@triton.jit` helper body under the CPU interpreter (exactly
`tl`'s values), compiled by Triton and by Gluon for sm_90 (its AutoLayout blocks resolved
by the layouts the helpers give them), on a CPU; each in a child process, since
TRITON_INTERPRET is read when a kernel is defined."""

from __future__ import annotations

import json
import re
import sys

import pytest
import triton
import triton.language as tl
from mono_peer.testing import child_json
from mono_runtime import lang as lg


@triton.jit
def _helper(x, y, n):
    """Every constructor and layout helper of lang, in one body: y[0:16] the row sums of
    x[16, 16] (a bf16 tensor-core dot of x and ones), y[16:24] the sums of row pairs
    (2i, 2i + 1) as the bf16 pair split reads them, y[32] a scan's last value."""
    acc = lg.anchor(lg.zeros((16, 16), tl.float32))
    rows = lg.along(lg.arange(0, 16), acc, 1)
    cols = lg.arange(0, 16)
    xs = tl.load(x + rows[:, None] * 16 + cols[None, :], mask=rows[:, None] < n, other=0.0)
    ones = lg.anchor(lg.full((16, 16), 1.0, tl.float32))
    acc = lg.dot_bf16(xs.to(tl.bfloat16), ones.to(tl.bfloat16), acc)  # these values: exact
    total = lg.zeros_like(rows, tl.float32) + tl.sum(acc, 1) / 16.0
    tl.store(y + rows, total)
    lo, hi = tl.split(tl.reshape(tl.trans(lg.row_pairs(acc)), (16, 8, 2)))
    q = lg.arange(0, 8)
    out = lg.like(y + 16 + q[None, :] * 0 + lg.arange(0, 16)[:, None] * 0 + q[None, :], lo)
    tl.store(out, lo + hi, mask=lg.like((q[None, :] >= 0) & (lg.arange(0, 16)[:, None] == 0), lo))
    used = tl.max(tl.where(acc > 0, 1, 0), 0)
    pos = lg.along(tl.cumsum(lg.plain(used), 0), acc, 0)
    tl.store(y + 32, tl.max(pos, 0))


@triton.jit
def _kernel(x, y, n, GL: tl.constexpr):
    """GL: which compiler (Triton's cache key does not tell Gluon's compile of the same
    body from Triton's: a constexpr must)."""
    _helper(x, y, n)


@triton.jit
def _token_sums(src, out, S: tl.constexpr, ROWS: tl.constexpr):
    """A [128 rows, S tokens] block summed over 8 parts (K2's dsum), anchored plainly or
    with its lanes down the rows (ROWS)."""
    n = lg.arange(0, 128)
    t = lg.arange(0, S)
    if ROWS:
        base = lg.anchor_rows(src + n[:, None] * S + t[None, :])
    else:
        base = lg.anchor(src + n[:, None] * S + t[None, :])
    total = lg.zeros_like(base, tl.float32)
    for q in tl.static_range(8):
        total += tl.load(base + q * (128 * S), volatile=True)
    tl.store(out + n[:, None] * S + t[None, :], total)


@triton.jit
def _popc(x, y):
    from mono_runtime import decode_triton as dt

    i = lg.anchor(lg.arange(0, 8))
    tl.store(y + i, dt.popc(tl.load(x + i).to(tl.uint32, bitcast=True)))


POPC_WORDS = [0, 1, 0x80000000, 0xFFFFFFFF, 0x0F0F0F0F, 0x12345678, 0xDEADBEEF, 0x7FFFFFFF]


def popc_interpreted() -> list:
    """decode_triton.popc's counts of POPC_WORDS under the interpreter."""
    import torch

    x = torch.tensor(POPC_WORDS, dtype=torch.int64).to(torch.int32)
    y = torch.zeros(8, dtype=torch.int32)
    _popc[(1,)](x, y)
    return y.tolist()


def interpreted() -> list:
    import torch

    x = torch.arange(256, dtype=torch.float32).reshape(16, 16)
    y = torch.zeros(33)
    _kernel[(1,)](x, y, 12, False)
    return y.tolist()


def compiled() -> dict:
    from mono_runtime.compile_check import compile_for
    from triton.experimental import gluon

    gluon_kernel = gluon.jit(_kernel.fn)
    types = {"x": "*fp32", "y": "*fp32", "n": "i32"}
    out = {}
    for name, fn in (("triton", _kernel), ("gluon", gluon_kernel)):
        k = compile_for(fn, types, {"GL": name == "gluon"}, num_warps=4)
        ptx = k.asm["ptx"]
        # a Gluon compile has no ttir stage: the binary is the compiler's it was asked for
        out[name] = (
            "ld.global" in ptx
            and "st.global" in ptx
            and "mma.sync" in ptx
            and ("ttir" in k.asm) == (name == "triton")
        )
    # global loads a thread of `_token_sums` under Gluon at S = 1, each anchoring
    from mono_runtime.sass import sass_of

    token_sums = gluon.jit(_token_sums.fn)
    for rows in (0, 1):
        k = compile_for(token_sums, {"src": "*fp32", "out": "*fp32"}, {"S": 1, "ROWS": rows})
        out[f"ldg-{rows}"] = len(re.findall(r"\bLDG", sass_of(k)))
    return out


@pytest.mark.timeout(200)
def test_helpers_give_tl_values_in_the_interpreter():
    y, _ = child_json([__file__, "interpreted"], 180, TRITON_INTERPRET="1")
    sums = [sum(range(16 * r, 16 * r + 16)) if r < 12 else 0.0 for r in range(16)]
    assert y[:16] == sums
    assert y[16:24] == [sums[2 * i] + sums[2 * i + 1] for i in range(8)]  # row pairs
    assert y[32] == 16.0


@pytest.mark.timeout(200)
def test_popc_counts_set_bits_in_the_interpreter():
    got, _ = child_json([__file__, "popc"], 180, TRITON_INTERPRET="1")
    assert got == [bin(w).count("1") for w in POPC_WORDS]


@pytest.mark.timeout(300)
def test_one_body_compiles_under_triton_and_gluon():
    got, _ = child_json([__file__, "compiled"], 280, TRITON_INTERPRET="0")
    assert (got["triton"], got["gluon"]) == (True, True)
    # the plain layout's lanes lie along the tokens: at S = 1 each lane loads every value
    # of its warp's rows (32 rows x 8 parts); lanes down the rows load one row each
    assert (got["ldg-0"], got["ldg-1"]) == (256, 8), got


if __name__ == "__main__":
    modes = {"interpreted": interpreted, "popc": popc_interpreted, "compiled": compiled}
    print(json.dumps(modes[sys.argv[1]]()))
