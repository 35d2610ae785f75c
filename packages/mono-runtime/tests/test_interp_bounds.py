"""mono_runtime.interp_bounds: a kernel reading one element past its tensor is reported
with its source line; in-bounds kernels, masked-off lanes and allowed ranges are not."""

from __future__ import annotations

import json

import triton
import triton.language as tl
from mono_peer.testing import child_json


@triton.jit
def copy(src, dst, n, EXTRA: tl.constexpr):
    i = tl.arange(0, 16)
    m = i < n + EXTRA
    tl.store(dst + i, tl.load(src + i, mask=m, other=0.0), mask=i < n)  # the load


@triton.jit
def through_table(table, dst):
    p = tl.load(table).to(tl.pointer_type(tl.float32))
    tl.atomic_add(dst, tl.load(p + 1))


def _cases() -> dict:
    """Run in a child under TRITON_INTERPRET=1 (Triton reads it when a kernel is defined:
    the kernels above run interpreted only there)."""
    import torch
    from mono_runtime.interp_bounds import OutOfBounds, checking

    out = {}
    src, dst = torch.arange(16.0)[:8], torch.zeros(8)
    for extra in (0, 1):
        with checking(record_only=True) as b:
            copy[(1,)](src, dst, 8, extra)
        out[f"copy+{extra}"] = [(v.op, v.address - src.data_ptr(), v.line) for v in b.violations]
    try:
        with checking():
            copy[(1,)](src, dst, 8, 1)
        out["raised"] = False
    except Exception as err:  # the interpreter wraps it
        out["raised"] = isinstance(err.__cause__, OutOfBounds) or "OutOfBounds" in repr(err)
    target = torch.ones(2)
    table = torch.tensor([target.data_ptr()], dtype=torch.int64)
    for allow in (False, True):
        with checking(*([target] if allow else []), record_only=True) as b:
            through_table[(1,)](table, dst)
        out[f"table allowed={allow}"] = [v.op for v in b.violations]
    return out


def test_one_past_reported_in_bounds_not():
    got, _ = child_json([__file__], 240, TRITON_INTERPRET="1")
    assert got["copy+0"] == [], got
    ((op, offset, line),) = got["copy+1"]
    assert op == "load" and offset == 8 * 4 and line.endswith("# the load"), got
    assert got["raised"], got
    assert got["table allowed=False"] == ["load"], got  # the pointer read from the table
    assert got["table allowed=True"] == [], got


if __name__ == "__main__":
    print(json.dumps(_cases()))
