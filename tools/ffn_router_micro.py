"""Time the FFN router item's arithmetic alone on a GPU: 16 experts x 384 columns of the
fp32 router GEMV (MiniMax-M3 at one TP4 rank's shapes, 128 items in one launch), each way
of writing it, at S = 1, 4, 16: us an item from the device clock, and the error against
fp64. The FFN's `rrows` tile default comes from this table (docs/PERFORMANCE.md).

    PYTHONPATH=... python3 tools/ffn_router_micro.py
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

H, E, RP = 6144, 128, 16
RK = H // RP
WAYS = {0: "one fp32 tl.dot a 128-column chunk", 1: "one row at a time", 2: "tf32x3 tl.dot"}


@triton.jit
def router_items(
    xn, router, logit, ns, H: tl.constexpr, E: tl.constexpr, S: tl.constexpr,
    RK: tl.constexpr, RP: tl.constexpr, WAY: tl.constexpr,
):  # fmt: skip
    u = tl.program_id(0)
    g = u // RP
    part_k = u % RP
    t0 = globaltimer()
    rows = tl.arange(0, 16)
    ex = g * 16 + tl.arange(0, 16)
    acc = tl.zeros((16, 16), tl.float32)  # [rows, experts]
    for c in tl.static_range(RK // 128):
        k = part_k * RK + c * 128 + tl.arange(0, 128)
        wr = tl.load(router + ex[:, None] * H + k[None, :])
        if WAY == 1:
            for s in tl.static_range(S):
                x = tl.load(xn + s * H + k).to(tl.float32)
                acc += tl.where(rows[:, None] == s, tl.sum(wr * x[None, :], 1)[None, :], 0.0)
        elif WAY == 0:
            x = tl.load(xn + rows[:, None] * H + k[None, :], mask=rows[:, None] < S, other=0.0)
            acc += tl.dot(x.to(tl.float32), tl.trans(wr), input_precision="ieee")
        else:
            x = tl.load(xn + rows[:, None] * H + k[None, :], mask=rows[:, None] < S, other=0.0)
            acc += tl.dot(x.to(tl.float32), tl.trans(wr), input_precision="tf32x3")
    tl.store(logit + (part_k * S + rows[:, None]) * E + ex[None, :], acc, mask=rows[:, None] < S)
    tl.store(ns + u, globaltimer() - t0)


def main() -> int:
    dev = "cuda"
    xn = torch.randn(16, H, device=dev).to(torch.bfloat16)
    router = torch.randn(E, H, device=dev)
    ns = torch.zeros(E // 16 * RP, dtype=torch.int64, device=dev)
    grid = (E // 16 * RP,)
    for s in (1, 4, 16):
        logit = torch.zeros(RP * s * E, device=dev)
        ref = xn[:s].double() @ router.double().T
        for way, name in WAYS.items():

            def launch(s=s, way=way, logit=logit):
                router_items[grid](xn, router, logit, ns, H, E, s, RK, RP, way, num_warps=4)

            launch()
            torch.cuda.synchronize()
            got = logit.view(RP, s, E).sum(0).double()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            launch_us = triton.testing.do_bench_cudagraph(launch) * 1e3
            launch()
            torch.cuda.synchronize()
            item = ns.double() / 1e3
            print(
                f"S={s:2d} {name:34s} item {item.mean().item():6.2f} us (max "
                f"{item.max().item():6.2f}), launch {launch_us:6.2f} us, max rel err {err:.1e}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
