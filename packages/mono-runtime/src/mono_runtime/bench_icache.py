"""What a once-run item's code costs on a GPU: N steps of ILP independent FMA chains a
thread as N x ILP straight-line instructions (a `static_range`, run once, so every
instruction comes from a cold instruction cache) against the same steps in a loop (one
body, fetched once), per program. ILP 1 is latency-bound (4 cycles a step leave the fetch
time to run ahead); ILP 8 asks for an instruction every cycle, so there a cold fetch shows.

Why: a persistent kernel's short items (K2's mix, dsum, lred, route) each run once per
program, and K2's sm_90 build is ~270 KB of SASS; on an H100 those items took 2.5-40 us of
work for a few KB of data. If straight-line code costs fetch time per KB, an item's code
size is its latency and rolled loops win; if not, the time is elsewhere. H100 (stop 48):
straight code ran faster than its loop at every size up to 64 KB, with its code in L2 or
swept out of it: the time is elsewhere.

Run on the GPU machine: `python3 -m mono_runtime.bench_icache` (prints a table: median and
slowest program, ns, and what the straight code costs over the loop per KB of it).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from . import protocol_triton as T

A, B = 1.0000001, 0.5  # x -> x * A + B: no two steps fold into one (fp32, no fast-math)
_A = tl.constexpr(A)
_B = tl.constexpr(B)


@triton.jit
def _chain(
    x0, out, spans, n, N: tl.constexpr, ILP: tl.constexpr, ROLLED: tl.constexpr, CPU: tl.constexpr
):
    """Each thread: N steps x -> x * A + B on each of its ILP lanes (independent chains),
    timed by the program's clock; ROLLED: a loop of `n` (= N, a runtime value, so no
    compiler unrolls it) steps."""
    pid = tl.program_id(0)
    lane = tl.arange(0, 128)[:, None] * ILP + tl.arange(0, ILP)[None, :]
    x = tl.load(x0 + pid * 128 * ILP + lane)
    t0 = T.clock(0, CPU)
    if ROLLED:
        for _ in range(n):
            x = x * _A + _B
    else:
        for _ in tl.static_range(N):
            x = x * _A + _B
    t1 = T.clock(1, CPU)
    tl.store(out + pid * 128 * ILP + lane, x)
    tl.store(spans + pid, t1 - t0)


def reference(x0: torch.Tensor, n: int) -> torch.Tensor:
    """The chain in fp32 on the host, step by step (each product rounded, then the sum:
    a fused FMA may differ in the last bit, so tests compare with a tolerance)."""
    x = x0.clone()
    for _ in range(n):
        x = x * A + B
    return x


def run_chain(n: int, rolled: bool, programs: int, device: str, cpu: bool = False, ilp: int = 1):
    """(x0, out, spans) of one launch: spans[p] is program p's clock delta (ns on a GPU)."""
    g = torch.Generator().manual_seed(n)
    x0 = torch.rand(programs * 128 * ilp, generator=g).to(device)
    out = torch.empty_like(x0)
    spans = torch.zeros(programs, dtype=torch.int64, device=device)
    _chain[(programs,)](x0, out, spans, n, N=n, ILP=ilp, ROLLED=rolled, CPU=cpu)
    return x0, out, spans


FLUSH_STEPS = 4096  # a flush binary's straight-line steps (~64 KB of code; Triton takes
# ~20 s to trace one, and 16384 steps ~260 s)


def _flush(binaries: int, programs: int) -> None:
    """Launch `binaries` distinct straight-line kernels (~64 KB of code each): what K2's
    other stages do to an item's code between two layers."""
    for i in range(binaries):
        run_chain(FLUSH_STEPS - i, False, programs, "cuda")


def _table(shapes: list[tuple[int, int]], programs: int, flush: int, l2_mb: int) -> list[dict]:
    """Each (N, ILP) in both forms, timed right after `_flush(flush)` and, with `l2_mb`,
    after reading that many MB: the code then comes from HBM, as a persistent kernel's
    does once its weight streams have swept the L2."""
    sweep = torch.empty(l2_mb << 18, device="cuda") if l2_mb else None
    rows = []
    for n, ilp in shapes:
        row = {"n": n, "ilp": ilp}
        for rolled in (False, True):
            run_chain(n, rolled, programs, "cuda", ilp=ilp)  # compiled, its data warm
            _flush(flush, programs)
            if sweep is not None:
                sweep.sum()
            _, _, spans = run_chain(n, rolled, programs, "cuda", ilp=ilp)
            s = spans.float().sort().values
            key = "loop" if rolled else "straight"
            row[f"{key}_median_ns"] = float(s[len(s) // 2])
            row[f"{key}_max_ns"] = float(s[-1])
        extra = row["straight_median_ns"] - row["loop_median_ns"]
        row["straight_extra_ns_per_kb"] = extra / (n * ilp * 16 / 1024)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shapes",
        default="256x1,1024x1,4096x1,64x8,256x8,512x8",
        help="N x ILP: steps, and independent chains a thread (code: N x ILP FMAs)",
    )
    ap.add_argument("--programs", type=int, default=264, help="programs a launch (2 an SM)")
    ap.add_argument("--flush", type=int, default=4, help="~64 KB binaries run in between")
    ap.add_argument("--l2-mb", type=int, default=0, help="then MB read to sweep the L2")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in v.split("x")) for v in a.shapes.split(",")]
    rows = _table(shapes, a.programs, a.flush, a.l2_mb)
    sweep = f", {a.l2_mb} MB read after them" if a.l2_mb else ""
    print(
        f"{torch.cuda.get_device_name()}: {a.programs} programs, 4 warps each; "
        f"{a.flush} binaries{sweep}"
    )
    print("N x ILP   straight med/max ns    loop med/max ns    straight extra ns per KB")
    for r in rows:
        print(
            f"{r['n']:>4} x {r['ilp']:<3} "
            f"{r['straight_median_ns']:>9.0f} / {r['straight_max_ns']:<9.0f} "
            f"{r['loop_median_ns']:>8.0f} / {r['loop_max_ns']:<8.0f} "
            f"{r['straight_extra_ns_per_kb']:>10.1f}"
        )


if __name__ == "__main__":
    main()
