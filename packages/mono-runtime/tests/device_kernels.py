"""Small kernels that exercise the Triton protocol helpers one at a time.

Loaded by path inside child processes that run with TRITON_INTERPRET=1 (never imported by
the pytest process, which must not decide Triton's mode for other packages' tests)."""

import triton
import triton.language as tl
from mono_runtime import protocol_triton as T


@triton.jit
def tag_kernel(ctl, slots, out, N: tl.constexpr):
    for j in tl.static_range(N):
        tl.store(out + j, T.step_tag(ctl, tl.load(slots + j)))


@triton.jit
def exchange_kernel(
    ctl, health, peers, rank, world, out, slot, skew, region, BLOCK: tl.constexpr, CPU: tl.constexpr
):
    """Every rank pushes BLOCK int32 values (rank * 1000 + lane) to every peer's row
    `rank`, then reads every row (tag + skew: a skew makes the wait give up). Rows are
    double-buffered by slot parity (PROTOCOL.md section 2): a rank one launch ahead must
    not overwrite what a slower peer has yet to read."""
    tag = T.step_tag(ctl, slot)
    lanes = tl.arange(0, BLOCK) + (slot & 1) * world * BLOCK
    T.fault_stall(ctl, peers, rank, world, CPU)
    for p in range(0, world):
        T.publish(
            T.peer_data(peers, p) + rank * BLOCK + lanes,
            rank * 1000 + lanes % BLOCK,
            tag,
            lanes == lanes,
            "sys",
        )
    ok = tag == tag
    for r in range(0, world):
        v, got = T.poll(
            T.peer_data(peers, rank) + r * BLOCK + lanes,
            lanes == lanes,
            tag + skew,
            ctl,
            health,
            peers,
            rank,
            world,
            region,
            r * BLOCK,
            CPU,
        )
        tl.store(out + r * BLOCK + lanes % BLOCK, v)
        ok = ok & got
    tl.store(out + world * BLOCK, ok.to(tl.int32))


@triton.jit
def ticket_kernel(
    ctl, health, peers, rank, world, counter, done, order, n_items, slot, region, CPU: tl.constexpr
):
    """A ticket loop whose item t waits for item t - 1 and records t's position in order."""
    tag = T.step_tag(ctl, slot)
    t = T.ticket_take(counter, n_items)
    while t < n_items:
        ok = tag == tag
        if t > 0:
            ok = T.ticket_wait(done, t - 1, tag, ctl, health, peers, rank, world, region, CPU)
        prev = tl.load(order + tl.maximum(t - 1, 0))
        tl.store(order + t, tl.where(t > 0, prev + 1, 1) * ok.to(tl.int64))
        T.ticket_finish(done, t, tag)
        t = T.ticket_take(counter, n_items)


@triton.jit
def reduce_kernel(
    ctl,
    health,
    peers,
    rank,
    world,
    x32,
    out_lo,
    out_hi,
    slot,
    region,
    BLOCK: tl.constexpr,
    CPU: tl.constexpr,
):
    """Push this rank's bf16x2 row to every peer, then sum rows of every rank in order."""
    tag = T.step_tag(ctl, slot)
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x32 + rank * BLOCK + lanes)
    for p in range(0, world):
        T.publish(T.peer_data(peers, p) + rank * BLOCK + lanes, x, tag, lanes < BLOCK, "sys")
    lo, hi, ok = T.reduce_bf16x2(
        T.peer_data(peers, rank) + lanes,
        BLOCK,
        lanes < BLOCK,
        tag,
        ctl,
        health,
        peers,
        rank,
        world,
        region,
        0,
        CPU,
    )
    tl.store(out_lo + lanes, tl.where(ok, lo, float("nan")))
    tl.store(out_hi + lanes, tl.where(ok, hi, float("nan")))


@triton.jit
def seen_kernel(ctl, log, n):
    """Record the step (rel epoch) this launch runs in at log[(rel - 1) % n]."""
    rel = T.step_tag(ctl, 0) >> 8
    tl.store(log + (rel - 1) % n, rel)
