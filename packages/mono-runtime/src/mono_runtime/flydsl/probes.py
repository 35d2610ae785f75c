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
        ptr = fx.inttoptr(fx.PointerType.get(T.i32, fx.AddressSpace.Global, 4),
                          out + fx.Int64(fx.block_idx.x) * 4)
        fx.generic_store(ptr, fx.Int32(fx.block_idx.x))

    @flyc.jit
    def launch(out: Int64, stream: fx.Stream = fx.Stream(None)):  # noqa: B008
        trivial(out).launch(grid=(1,), block=(threads,), stream=stream)

    return launch, (0,)


def build_protocol_probe(world: int = 4, programs: int = 256, threads: int = 256,
                         poll_with_prefetch: bool = False):
    """One kernel that uses every protocol helper the way the FFN build does: a ticket loop
    over ``programs * 2`` items, a device-scope hand-off between programs, a system-scope
    push to every peer, a rank-ordered reduce of the peers' pushes, and bounded waits.

    Outputs: ``out[t]`` = t - 1 for items t >= 1 (from the hand-off), ``out[items + b]`` =
    the reduce of column b (1.5 from every rank: 1.5 * world). ``poll_with_prefetch``
    breaks the weight-load rule on purpose (the trace must refuse it)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl.expr import const_expr, range_constexpr
    from flydsl.expr.typing import Int32, Int64

    from . import protocol as P

    items = 2 * programs

    @flyc.kernel(name=f"mono_protocol_probe_w{world}", known_block_size=[threads, 1, 1])
    def probe(scratch: Int64, peers: Int64, health: Int64, rank: Int32, epoch: Int64,
              deadline: Int64, out: Int64):
        tid = fx.thread_idx.x
        ep = P.load32(epoch, 0, P.DEVICE)
        prog = P.program(peers, health, rank, world, ep, deadline)
        tag = P.tag_of(ep, 3)
        if tid == 0:
            ticket = P.ticket_take(scratch)
            while ticket < items:
                # device scope: item t announces itself; item t - 1 (a smaller ticket) is awaited
                P.publish(scratch + 64, ticket, ticket, tag, P.DEVICE)
                if ticket > 0:
                    got, _ = P.poll(prog, [(scratch + 64, ticket - 1)], tag, P.DEVICE, 1)
                    P.store32(out, ticket, got[0], P.DEVICE)
                ticket = P.ticket_take(scratch)
            P.ticket_finish(scratch, ticket, items, programs)
        if tid < world:
            # system scope: this rank's partial of column bid into slot (bid * world + rank)
            for r in range_constexpr(world):
                if tid == r:
                    P.publish(P.peer(prog, r), fx.Int32(fx.block_idx.x) * world + rank,
                              fx.Float32(1.5), tag, P.SYSTEM)
        if tid == 0:
            if const_expr(poll_with_prefetch):
                P.loads_issued(prog)
            total, _ = P.poll_reduce(prog, 0, fx.block_idx.x, tag, 2)
            P.store32(out, items + fx.block_idx.x, total.bitcast(fx.Int32), P.DEVICE)

    @flyc.jit
    def launch(scratch: Int64, peers: Int64, health: Int64, rank: Int32, epoch: Int64,
               deadline: Int64, out: Int64, stream: fx.Stream = fx.Stream(None)):  # noqa: B008
        probe(scratch, peers, health, rank, epoch, deadline, out).launch(
            grid=(programs,), block=(threads,), stream=stream)

    return launch, (0, 0, 0, 0, 0, 0, 0)
