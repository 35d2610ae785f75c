"""Small FlyDSL kernels that exercise the toolchain and every protocol helper, compiled by
tests for gfx950 / gfx942 and checked in their ISA.

No ``from __future__ import annotations`` in modules that define kernels: FlyDSL reads the
parameter annotations (``Int64``) at trace time, and a string annotation it cannot resolve
silently becomes a 32-bit argument.
"""


def build_trivial(threads: int = 64):
    """A kernel that stores its workgroup id: the smallest thing FlyDSL can compile."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl.expr.typing import Int64, T

    @flyc.kernel(name=f"mono_trivial_t{threads}", known_block_size=[threads, 1, 1])
    def trivial(out: Int64):
        ptr = fx.inttoptr(
            fx.PointerType.get(T.i32, fx.AddressSpace.Global, 4), out + fx.Int64(fx.block_idx.x) * 4
        )
        fx.generic_store(ptr, fx.Int32(fx.block_idx.x))

    @flyc.jit
    def launch(out: Int64, stream: fx.Stream = fx.Stream(None)):  # noqa: B008
        trivial(out).launch(grid=(1,), block=(threads,), stream=stream)

    return launch, (0,)


def build_protocol_probe(
    world: int = 4, programs: int = 256, threads: int = 256, poll_with_prefetch: bool = False
):
    """One kernel that uses every protocol helper the way a mono kernel does: a ticket loop
    over ``2 * programs`` items in which item t waits for item t - 1 (device scope), the
    injected stall, a push of 1.5 from this rank into every peer (system scope) and the
    rank-ordered reduce of what every rank pushed here, all waits bounded.

    ``scratch``: int64 words, [0] the ticket counter, [8 ..] the items' done pairs.
    Outputs (int32 words): ``out[t]`` = t - 1 for items t >= 1 (read through the hand-off),
    ``out[items + b]`` = program b's reduce (1.5 * world as fp32 bits, NaN if a wait gave
    up). ``poll_with_prefetch`` breaks the weight-load rule on purpose: the trace refuses.
    """
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl.expr import const_expr, range_constexpr
    from flydsl.expr.typing import Int32, Int64

    from .. import protocol as proto
    from . import protocol as P

    items = 2 * programs
    handoff = proto.region_id("probe.handoff")
    pushed = proto.region_id("probe.push")

    @flyc.kernel(name=f"mono_protocol_probe_w{world}", known_block_size=[threads, 1, 1])
    def probe(ctl: Int64, health: Int64, peers: Int64, rank: Int32, scratch: Int64, out: Int64):
        tid = fx.thread_idx.x
        bid = fx.block_idx.x
        prog = P.program(ctl, health, peers, rank, world)
        tag = P.step_tag(ctl, 3)
        done = scratch + 64
        if tid == 0:
            t = P.ticket_take(scratch, items, programs)
            while t < items:
                if t > 0:
                    ok = P.ticket_wait(prog, done, t - 1, tag, handoff)
                    got = P.load64(done, t - 1, P.DEVICE)
                    P.store64(out, t, got, P.DEVICE)
                P.ticket_finish(done, t, tag)
                t = P.ticket_take(scratch, items, programs)
        P.fault_stall(prog)
        for r in range_constexpr(world):
            if tid == r:
                P.publish(
                    P.peer_data(prog, r),
                    fx.Int64(bid) + fx.Int64(rank) * programs,
                    fx.Float32(1.5),
                    tag,
                    P.SYSTEM,
                )
        if tid == 0:
            if const_expr(poll_with_prefetch):
                P.loads_issued(prog)
            total, ok = P.reduce_f32(prog, P.own_data(prog), programs, bid, tag, pushed)
            total = ok.select(total, fx.Float32(float("nan")))
            fx.generic_store(P.word_ptr(out, items + bid, fx.Int32), total.bitcast(fx.Int32))

    @flyc.jit
    def launch(
        ctl: Int64,
        health: Int64,
        peers: Int64,
        rank: Int32,
        scratch: Int64,
        out: Int64,
        stream: fx.Stream = fx.Stream(None),  # noqa: B008
    ):
        probe(ctl, health, peers, rank, scratch, out).launch(
            grid=(programs,), block=(threads,), stream=stream
        )

    return launch, (0, 0, 0, 0, 0, 0)
