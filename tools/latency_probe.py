"""How long a fused kernel's small steps take on an otherwise idle GPU, the steps that make
a stage boundary cost more than its data: a done-pair wait (`wait_done`: one poll, then an
acquire atomic on every pair) against the same poll followed by one acquire fence, with
one program or a whole grid waiting on the same pairs; a row item's all-reduce plus RMSNorm
(the drafter's `_row_item`, one item a row, over pushed peer pairs) and its pieces at
several chunk widths; a device clock read. Each figure is the mean of ITERS repeats
inside one launch, timed by the device clock, so launch overheads do not count; every wait
finds its pairs already set.

    PYTHONPATH=... python3 tools/latency_probe.py [--iters 200] [--json FILE]

The drafter's timeline (stop 30) put a row item's norm at 13 us after its inputs were in
and the polls' last push at 17-30 us after the pushing items ended: this says which of
those steps is slow in itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from mono_kernels_kimi.drafter.triton_build import _add_chunk, _lanes, _normed_store, _row_item
from mono_runtime import protocol as P
from mono_runtime import protocol_triton as pt

H = 7168  # the Kimi-K3 drafter's hidden size: a row item's columns
ROWS = 16  # rows a row probe's pairs hold (programs: one row each)
# row_kernel's STEP values, in order
ROW_STEPS = ("norm", "polls", "loads", "pass 1", "pass 2")


@triton.jit
def _fence_acquire(CPU: tl.constexpr):
    """One gpu-scope acquire-release fence a thread (a poll's relaxed reads, then this, is
    an acquire pattern); nothing under the interpreter."""
    if not CPU:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [tl.program_id(0)], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def wait_kernel(
    done, ctl, health, peers, out, iters, N: tl.constexpr, N2: tl.constexpr,
    FENCE: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Each program waits `iters` times for done pairs 0..N-1 (set before the launch):
    `wait_done` as the kernels do, or (FENCE) the poll and one fence. -> out[program]: ns."""
    tag = pt.step_tag(ctl, 0)
    t0 = pt.clock(0, CPU)
    for _ in range(0, iters):
        if FENCE:
            i = tl.arange(0, N2)
            pt.poll(done + i, i < N, tag, ctl, health, peers, 0, 1, 0, 0, CPU)
            _fence_acquire(CPU)
            tl.debug_barrier()
        else:
            pt.wait_done(done, 0, N, N2, tag, ctl, health, peers, 0, 1, 0, 0, CPU)
    tl.store(out + tl.program_id(0), pt.clock(0, CPU) - t0)


@triton.jit
def row_kernel(
    w, dst, scratch, ctl, health, peers, out, iters, RC: tl.constexpr, H: tl.constexpr,
    ROWS: tl.constexpr, STEP: tl.constexpr, CPU: tl.constexpr,
):  # fmt: skip
    """Program g repeats a piece of row g's all-reduce + RMSNorm `iters` times (one rank's
    pushed pairs at the head of its peer data, set before the launch). STEP: 0 the whole
    `_row_item` (one item the row); 1 its polls alone; 2 plain (.cg) loads of the same
    pairs instead; 3 its first pass (`_add_chunk`: polls, residual, fp32 store); 4 its
    second pass alone (`_normed_store`). -> out[program]: ns."""
    g = tl.program_id(0)
    tag = pt.step_tag(ctl, 0)
    src = pt.peer_data(peers, 0)
    zero = tl.arange(0, 1) < 0
    O_TOT: tl.constexpr = ROWS * H * 2
    t0 = pt.clock(0, CPU)
    for _ in range(0, iters):
        if STEP == 0:
            _row_item(
                g, False, src, w, src, 0, dst, scratch, ROWS, zero, tag, ctl, health, peers, 0,
                1, H, RC, 1, 1, ROWS, 0, O_TOT, 0, 0, 1e-6, CPU,
            )  # fmt: skip
        elif STEP == 4:
            ss = tl.full((1,), 1.0, tl.float32)
            _normed_store(g, w, dst, scratch, ROWS, ss, zero, H, RC, 1, O_TOT, 1e-6)
        else:
            ss = tl.zeros((1,), tl.float32)
            for c in range(0, (H + RC - 1) // RC):
                if STEP == 3:
                    ss += _add_chunk(
                        g, c, src, 0, scratch, ROWS, tag, ctl, health, peers, 0, 1, H, RC, 1,
                        ROWS, 0, O_TOT, CPU,
                    )  # fmt: skip
                else:
                    row, p, live = _lanes(g, c, ROWS, H, 1, RC)
                    if STEP == 2:
                        v = tl.load(
                            src + row * (H // 2) + p, mask=live, other=0, cache_modifier=".cg"
                        )
                        lo = pt.bf16x2_lo(pt.pair_payload(v))
                        hi = pt.bf16x2_hi(pt.pair_payload(v))
                    else:
                        lo, hi, ok = pt.reduce_bf16x2(
                            src + row * (H // 2) + p, ROWS * (H // 2), live, tag, ctl, health,
                            peers, 0, 1, 0, g * (H // 2) + c * (RC // 2), CPU,
                        )  # fmt: skip
                    ss += tl.sum(tl.where(live, lo * lo + hi * hi, 0.0))
            tl.store(dst + g + tl.arange(0, 1), ss.to(tl.int32, bitcast=True))
    tl.store(out + g, pt.clock(0, CPU) - t0)


@triton.jit
def clock_kernel(out, iters, CPU: tl.constexpr):
    """`iters` dependent device clock reads. -> out[program]: ns."""
    t0 = pt.clock(0, CPU)
    last = t0
    for _ in range(0, iters):
        last = tl.maximum(last, pt.clock(0, CPU))
    tl.store(out + tl.program_id(0), last - t0)


def _protocol(device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """One rank's ctl (epoch 1 of its era, a 1 s deadline), health, peer buffer (alarm head
    clear) and its pointer table; the tag of slot 0."""
    ctl = torch.zeros(P.CTL_WORDS, dtype=torch.int64, device=device)
    ctl[P.CTL_EPOCH] = 1
    ctl[P.CTL_DEADLINE] = 10**9
    health = torch.zeros(P.HEALTH_WORDS, dtype=torch.int64, device=device)
    buf = torch.zeros(P.PEER_HEAD // 8 + ROWS * H // 2, dtype=torch.int64, device=device)
    peers = torch.tensor([buf.data_ptr()], dtype=torch.int64, device=device)
    return ctl, health, buf, peers, 1 << P.SLOT_BITS


def _pairs(tag: int, payload: torch.Tensor) -> torch.Tensor:
    return (tag << 32) | (payload.to(torch.int64) & 0xFFFFFFFF)


def _per_iter(out: torch.Tensor, iters: int) -> float:
    """Mean over programs of a program's ns a repeat, in us."""
    return float(out.double().mean()) / iters / 1e3


def measure(iters: int, device) -> list[dict]:
    ctl, health, buf, peers, tag = _protocol(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    done = _pairs(tag, torch.ones(128, dtype=torch.int64, device=device))
    for n in (1, 16, 72, 128):
        for grid in (1, sms):
            for fence in (False, True):
                out = torch.zeros(grid, dtype=torch.int64, device=device)
                for _ in range(2):  # the first launch compiles
                    wait_kernel[(grid,)](
                        done, ctl, health, peers, out, iters, N=n, N2=triton.next_power_of_2(n),
                        FENCE=fence, CPU=False, num_warps=4,
                    )  # fmt: skip
                torch.cuda.synchronize()
                rows.append(
                    dict(
                        step="wait", pairs=n, programs=grid,
                        acquire="one fence" if fence else "an atomic a pair",
                        us=_per_iter(out, iters),
                    )
                )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    pays = torch.randint(-(2**31), 2**31, (ROWS * H // 2,), generator=g).to(device)
    buf[P.PEER_HEAD // 8 :] = _pairs(tag, pays)
    w = torch.randn(H, generator=g).to(device=device, dtype=torch.bfloat16)
    dst = torch.zeros(ROWS * H // 2, dtype=torch.int32, device=device)
    scratch = torch.zeros(ROWS * H * 2 + ROWS * H * 4, dtype=torch.uint8, device=device)
    for step, what in enumerate(ROW_STEPS):
        for rc in (512, 1024, 2048, 4096):
            for grid in (1, ROWS):
                out = torch.zeros(grid, dtype=torch.int64, device=device)
                for _ in range(2):
                    row_kernel[(grid,)](
                        w, dst, scratch, ctl, health, peers, out, iters, RC=rc, H=H, ROWS=ROWS,
                        STEP=step, CPU=False, num_warps=4,
                    )  # fmt: skip
                torch.cuda.synchronize()
                rows.append(
                    dict(step=f"row {what}", columns=rc, programs=grid, us=_per_iter(out, iters))
                )
    out = torch.zeros(1, dtype=torch.int64, device=device)
    for _ in range(2):
        clock_kernel[(1,)](out, iters, CPU=False, num_warps=4)
    torch.cuda.synchronize()
    rows.append(dict(step="clock read", programs=1, us=_per_iter(out, iters)))
    if int(health[P.H_GIVEUPS]):
        raise RuntimeError(f"a probe's wait gave up: health {health.tolist()}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--json", default="", help="write the rows here too")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        print("latency_probe: needs a GPU (the figures are device clock times)", file=sys.stderr)
        return 2
    rows = measure(a.iters, torch.device("cuda"))
    for r in rows:
        what = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("step", "us"))
        print(f"{r['step']:10s} {what:60s} {r['us']:9.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
