"""The checks of `mono qualify`, in the order they run. Each is a function of one rank's
context that calls the packages' public API, returns a one-line detail when the machine
passes, and raises `CheckFailed` (or anything) when it does not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mono_tools.qualify import builds, collective
from mono_tools.qualify.context import CheckFailed, RankContext


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[RankContext], str]
    what: str  # one line for the README and --list
    timeout_s: float = 120.0  # the parent gives up on a rank silent for longer: a hang
    gpu_only: bool = False
    prepare: Callable[[RankContext], None] | None = None  # started before the first check


def ranks(ctx: RankContext) -> str:
    """Every rank sees the same world and the same backend, and no two share a GPU."""
    import torch

    name = torch.cuda.get_device_name(ctx.device) if ctx.gpu else "cpu"
    seen = ctx.gather((ctx.rank, ctx.backend, str(ctx.device), name))
    if [s[0] for s in seen] != list(range(ctx.world)):
        raise CheckFailed(f"ranks out of order: {[s[0] for s in seen]}")
    if len({s[1] for s in seen}) != 1:
        raise CheckFailed(f"ranks disagree on the backend: {[s[1] for s in seen]}")
    devices = [s[2] for s in seen]
    if ctx.gpu and len(set(devices)) != ctx.world:
        raise CheckFailed(f"two ranks share a GPU: {devices}")
    names = sorted({s[3] for s in seen})
    return f"{ctx.world} ranks on {', '.join(names)}"


PEER_BYTES = 1 << 20
SLOT = 64  # bytes each rank writes into every peer's buffer


def peer_memory(ctx: RankContext) -> str:
    """Every rank maps every peer's buffer: the address table is sane, each rank reads what
    each peer wrote into its own buffer, and writes into every peer's buffer land there."""
    import torch
    from mono_peer import PeerBuffer

    with PeerBuffer(PEER_BYTES, ctx.group, ctx.rank, ctx.world, ctx.device) as buf:
        table = buf.addresses.cpu().tolist()
        if len(table) != ctx.world or table[ctx.rank] != buf.local:
            raise CheckFailed(f"address table {table} does not hold this rank's {buf.local}")
        if len(set(table)) != ctx.world or 0 in table:
            raise CheckFailed(f"address table has zero or repeated entries: {table}")
        if buf.backend != ctx.backend:
            raise CheckFailed(f"buffer backend {buf.backend}, expected {ctx.backend}")
        if int(buf.bytes.count_nonzero()) != 0:
            raise CheckFailed("a fresh buffer is not zeroed")
        views = [buf.peer(r) for r in range(ctx.world)]
        if [v.data_ptr() for v in views] != table:
            raise CheckFailed("the peer views and the address table disagree")

        def pattern(writer: int, reader: int) -> torch.Tensor:
            base = torch.arange(SLOT, dtype=torch.int32, device=ctx.device)
            return ((base * 7 + writer * 31 + reader * 13 + 1) % 251).to(torch.uint8)

        # reads: each rank fills its own buffer's tail; every peer reads it through the table
        tail = slice(PEER_BYTES - SLOT, PEER_BYTES)
        buf.bytes[tail].copy_(pattern(ctx.rank, ctx.rank))
        _sync(ctx)
        for peer in range(ctx.world):
            seen = views[peer][tail]
            if not torch.equal(seen, pattern(peer, peer)):
                raise CheckFailed(f"read of rank {peer}'s buffer returned other bytes")
        # writes: each rank writes slot `rank` of every peer's buffer; each checks its own
        for peer in range(ctx.world):
            views[peer][ctx.rank * SLOT : (ctx.rank + 1) * SLOT].copy_(pattern(ctx.rank, peer))
        _sync(ctx)
        for writer in range(ctx.world):
            got = buf.bytes[writer * SLOT : (writer + 1) * SLOT]
            if not torch.equal(got, pattern(writer, ctx.rank)):
                raise CheckFailed(f"rank {writer}'s write into this rank's buffer did not land")
        _sync(ctx)  # nobody closes a buffer a peer is still reading
    return f"{PEER_BYTES >> 10} KiB per rank, {ctx.world}x{ctx.world} reads and writes"


def _sync(ctx: RankContext) -> None:
    """Device work done on this rank, then every rank at the same point."""
    if ctx.gpu:
        import torch

        torch.cuda.synchronize(ctx.device)
    ctx.barrier()


CHECKS: tuple[Check, ...] = (
    Check("ranks", ranks, "every rank joined one group, one GPU each", timeout_s=60),
    Check("peer memory", peer_memory, "every rank maps, reads and writes every peer's buffer"),
    Check(
        "tagged all-reduce",
        collective.tagged_allreduce,
        "the runtime's all-reduce (+ residual + RMSNorm): exact, bit-identical, several sizes",
    ),
    Check("epoch wrap", collective.epoch_wrap, "past 2^31 steps and across a tag era's end"),
    Check(
        "graph replay",
        collective.graph_replay,
        "step_begin + all-reduce captured in a graph, replayed with new inputs",
        gpu_only=True,
    ),
    Check(
        "fault under deadline",
        collective.fault_under_deadline,
        "a rank stalled under the deadline: right answer, no fault",
    ),
    Check(
        "fault over deadline",
        collective.fault_over_deadline,
        "a rank stalled past it: MonoFault with a timeline on every rank, then a clean step",
    ),
    Check(
        "kernel builds",
        builds.kernel_builds,
        "each build present compiles for its GPU (CPU) or matches its reference (GPU)",
        timeout_s=600,
        prepare=builds.start_compiles,
    ),
)
BY_NAME = {check.name: check for check in CHECKS}
