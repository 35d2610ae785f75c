"""How long K2's route picks and union take alone: one program of 4 warps (the Gluon build,
as K2's) runs `topk_triton.sigmoid_topk_row` over one row of 896 logits, or K2's `_union`
over S rows of 16 picks, reading the device clock around it; each result is checked (the
picks against torch's top-k, the slot table against the distinct ids). Inside K2 the same
code ran 4-6x slower (H100, stop 52: the route's in-warp picks 6.9 us alone, 29.6 inside;
the union 0.64 us alone, 4.19 inside at S = 1), where each item shares its SM with a
program streaming weights: this gives the alone figure a K2 timeline is read against.

Each beside a neighbour kernel queued first on another stream (a bf16 GEMV, a GEMM, a
copy), to tell which kind of neighbour slows them.

    PYTHONPATH=... python3 tools/k2_route_probe.py [--rows 1,4,16] [--reps 4]
        [--neighbours none,gemv,gemm,copy]
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


NEIGHBOURS = ("none", "gemv", "gemm", "copy")


def _neighbour(kind: str):
    """A callable that queues ~5-10 ms of `kind` work on the GPU: "gemv" (a bf16 matrix of
    1 GiB times a vector, as K2's weight streams: cp.async-free, but loads and FMAs),
    "gemm" (tensor cores, shared-memory and ldmatrix heavy), "copy" (loads and stores
    only), or None for "none"."""
    if kind == "none":
        return None
    dev = torch.device("cuda")
    if kind == "gemv":
        m = torch.randn(32768, 16384, device=dev, dtype=torch.bfloat16)
        v = torch.randn(16384, device=dev, dtype=torch.bfloat16)
        return lambda: [torch.mv(m, v) for _ in range(20)]
    if kind == "gemm":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        return lambda: [a @ a for _ in range(4)]
    if kind == "copy":
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        return lambda: [dst.copy_(src) for _ in range(10)]
    raise AssertionError(kind)


def _timed(launch, ns: torch.Tensor, busy) -> tuple[float, float]:
    """(best, median) of ns[0] over 5 launches, each beside `busy` work queued first on a
    side stream (its programs share the SMs the probe's one program runs on)."""
    side = torch.cuda.Stream()
    got = []
    for _ in range(5):
        if busy is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                busy()
        launch()
        torch.cuda.synchronize()
        got.append(ns.item())
    got.sort()
    return got[0], got[len(got) // 2]


def route(reps: int, busy=None) -> tuple[float, float, bool]:
    """(best and median us a route, the picks equal torch's top-k of sigmoid + bias)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(EXPERTS, generator=g, device=dev)
    bias = torch.randn(EXPERTS, generator=g, device=dev) * 0.1
    ids = torch.zeros(PICKS, dtype=torch.int32, device=dev)
    w = torch.zeros(PICKS, device=dev)
    ns = torch.zeros(1, dtype=torch.int64, device=dev)
    kernel = gluon.jit(_route_kernel.fn)
    best, mid = _timed(lambda: kernel[(1,)](logits, bias, ids, w, ns, reps, num_warps=4), ns, busy)
    ref = torch.topk(torch.sigmoid(logits) + bias, PICKS).indices.int()
    return best / reps / 1e3, mid / reps / 1e3, bool((ids == ref).all())


def union(s: int, busy=None) -> tuple[float, float, bool]:
    """(best and median us for the union of s rows' 16 picks, its slot table right)."""
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
    layout = (sk2, wt2, t_slote, t_wtab, t_ids, t_topw)
    best, mid = _timed(
        lambda: kernel[(1,)](scratch, ns, s, min(s * PICKS, EXPERTS), *layout, num_warps=4),
        ns,
        busy,
    )
    n = int(scratch[:4].view(torch.int32).item())
    want = torch.unique(picks)
    got = scratch[t_slote : t_slote + 4 * n].view(torch.int32).cpu()
    return best / 1e3, mid / 1e3, n == len(want) and bool((got == want.int()).all())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument(
        "--neighbours",
        default="none,gemv,gemm,copy",
        help="work queued beside each launch: none, gemv, gemm, copy",
    )
    a = p.parse_args(argv)
    kinds = a.neighbours.split(",")
    bad = [k for k in kinds if k not in NEIGHBOURS]
    if bad:
        p.error(f"--neighbours {','.join(bad)}: each must be one of {', '.join(NEIGHBOURS)}")
    print("us (best / median of 5 launches) beside each neighbour")
    for kind in kinds:
        busy = _neighbour(kind)
        best, mid, ok = route(a.reps, busy)
        print(f"{kind:5} route, a row of {EXPERTS}: {best:6.2f} / {mid:6.2f}; picks right: {ok}")
        for s in (int(x) for x in a.rows.split(",")):
            best, mid, ok = union(s, busy)
            print(
                f"{kind:5} union S={s:2d}: {best:6.2f} / {mid:6.2f}; table right: {ok}", flush=True
            )
        del busy
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
