"""How long K2's route picks and union take alone: one program of 4 warps (the Gluon build,
as K2's) runs `topk_triton.sigmoid_topk_row` over one row of 896 logits, or K2's `_union`
over S rows of 16 picks, reading the device clock around it; each result is checked (the
picks against torch's top-k, the slot table against the distinct ids). Inside K2 the same
code ran 4-6x slower (H100, stop 52: the route's in-warp picks 6.9 us alone, 29.6 inside;
the union 0.64 us alone, 4.19 inside at S = 1), where each item shares its SM with a
program streaming weights: this gives the alone figure a K2 timeline is read against.

    PYTHONPATH=... python3 tools/k2_route_probe.py [--rows 1,4,16] [--reps 4]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from mono_kernels_kimi.k2 import triton_build as k2
from mono_runtime import decode_triton as dt
from mono_runtime import lang as lg
from mono_runtime import protocol_triton as pt
from mono_runtime.topk_triton import sigmoid_topk_row
from triton.experimental import gluon

EXPERTS, PICKS = 896, 16  # Kimi-K3's router
E, E2, K = tl.constexpr(EXPERTS), tl.constexpr(triton.next_power_of_2(EXPERTS)), tl.constexpr(PICKS)


@triton.jit
def _route_kernel(logits, bias, ids_out, w_out, ns, REPS: tl.constexpr):
    """REPS routes of one row back to back (each depends on the last); ns: the clock span."""
    e = lg.anchor(lg.arange(0, E2))
    b = tl.load(bias + e, mask=e < E, other=0.0)
    x = tl.load(logits + e, mask=e < E, other=0.0)
    t0 = pt.clock(0, False)
    ids, w = sigmoid_topk_row(x, b, logits, 1, E, K, K, 2.5, True)
    for _ in range(1, REPS):
        x = x + (tl.sum(w, 0) == -1.0).to(tl.float32)  # (never true: a dependency)
        ids, w = sigmoid_topk_row(x, b, logits, 1, E, K, K, 2.5, True)
    t1 = dt.ready_after(w, True, False)
    kk = lg.anchor(lg.arange(0, K))
    tl.store(ids_out + kk, ids)
    tl.store(w_out + kk, w)
    tl.store(ns, t1 - t0)


@triton.jit
def _union_kernel(
    scratch, ns, S: tl.constexpr, MAXSLOTS: tl.constexpr, SK2: tl.constexpr,
    WT2: tl.constexpr, T_SLOTE: tl.constexpr, T_WTAB: tl.constexpr, T_IDS: tl.constexpr,
    T_TOPW: tl.constexpr,
):  # fmt: skip
    t0 = pt.clock(0, False)
    k2._union(scratch, S, E, E2, K, MAXSLOTS, SK2, WT2, 0, T_SLOTE, T_WTAB, T_IDS, T_TOPW)
    tl.debug_barrier()
    tl.store(ns, pt.clock(0, False) - t0)


def route(reps: int) -> tuple[float, bool]:
    """(us a route, the picks equal torch's top-k of sigmoid + bias)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(EXPERTS, generator=g, device=dev)
    bias = torch.randn(EXPERTS, generator=g, device=dev) * 0.1
    ids = torch.zeros(PICKS, dtype=torch.int32, device=dev)
    w = torch.zeros(PICKS, device=dev)
    ns = torch.zeros(1, dtype=torch.int64, device=dev)
    kernel = gluon.jit(_route_kernel.fn)
    best = None
    for _ in range(4):
        kernel[(1,)](logits, bias, ids, w, ns, reps, num_warps=4)
        torch.cuda.synchronize()
        best = ns.item() if best is None else min(best, ns.item())
    ref = torch.topk(torch.sigmoid(logits) + bias, PICKS).indices.int()
    return best / reps / 1e3, bool((ids == ref).all())


def union(s: int) -> tuple[float, bool]:
    """(us for the union of s rows' 16 picks, its slot table right)."""
    dev = torch.device("cuda")
    sk2, wt2 = (
        triton.next_power_of_2(s * PICKS),
        triton.next_power_of_2(min(s * PICKS, EXPERTS) * s),
    )
    t_slote = 64
    t_wtab = t_slote + 4 * triton.next_power_of_2(EXPERTS)
    t_ids = t_wtab + 4 * wt2
    t_topw = t_ids + 4 * sk2
    scratch = torch.zeros(t_topw + 4 * sk2, dtype=torch.uint8, device=dev)
    g = torch.Generator().manual_seed(s)
    picks = (
        torch.stack([torch.randperm(EXPERTS, generator=g)[:PICKS] for _ in range(s)])
        .int()
        .flatten()
    )
    scratch[t_ids : t_ids + 4 * s * PICKS].view(torch.int32).copy_(picks)
    scratch[t_topw : t_topw + 4 * s * PICKS].view(torch.float32).fill_(0.5)
    ns = torch.zeros(1, dtype=torch.int64, device=dev)
    kernel = gluon.jit(_union_kernel.fn)
    best = None
    for _ in range(4):
        kernel[(1,)](
            scratch,
            ns,
            s,
            min(s * PICKS, EXPERTS),
            sk2,
            wt2,
            t_slote,
            t_wtab,
            t_ids,
            t_topw,
            num_warps=4,
        )
        torch.cuda.synchronize()
        best = ns.item() if best is None else min(best, ns.item())
    n = int(scratch[:4].view(torch.int32).item())
    want = torch.unique(picks)
    got = scratch[t_slote : t_slote + 4 * n].view(torch.int32).cpu()
    return best / 1e3, n == len(want) and bool((got == want.int()).all())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--reps", type=int, default=4)
    a = p.parse_args(argv)
    us, ok = route(a.reps)
    print(
        f"route: {us:.2f} us a row of {EXPERTS} (16 picks), best of 4 launches; picks right: {ok}"
    )
    for s in (int(x) for x in a.rows.split(",")):
        us, ok = union(s)
        print(f"union S={s:2d}: {us:.2f} us, best of 4 launches; table right: {ok}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
