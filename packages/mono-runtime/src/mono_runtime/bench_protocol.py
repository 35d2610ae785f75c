"""What the protocol costs on a GPU, in ns: one publish+poll round trip between two programs,
and one step of a 132-program ticket loop (next to an empty launch of the same grid).

Run on the GPU machine: `python3 -m mono_runtime.bench_protocol` (prints a table), or call
`run()` from tools/gpu_run.py; `--variants` adds a table of ping-pong variants (warps,
fence, clock and alarm cadence, a bare spin floor) to see what one message costs and why;
`--push` a table of what publishing a block of pairs costs (the FFN's push items: 12
programs, 1 or 16 rows of 256 pairs each) with `publish_value` as configured (relaxed
64-bit stores on NVIDIA by default) at system and device scope against relaxed 64-bit
exchanges (each pair is one aligned 64-bit word, so a store is as indivisible as an
exchange).
Ticket-loop times come from CUDA graphs of many launches, so launch overhead is amortised
the way a captured decode step amortises it. Ping-pong times are the difference of two
launches (R and 2R rounds), each warmed up first with identical arguments: Triton
specializes an int on divisibility by 16, so a warm-up with other arguments can leave a
JIT compile inside the timed window.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from . import protocol as P
from . import protocol_triton as T
from .runner import MonoRunner


@triton.jit
def _ping_pong(ctl, health, peers, rounds, region, CPU: tl.constexpr):
    """Program 0 publishes round i, program 1 polls it and answers; program 0 polls the
    answer. Every round uses fresh pair positions with the step's tag: a real tagged
    exchange through L2, two one-way messages a round. Programs past 1 (a crowd, as a
    persistent kernel's waiters) poll the one pair program 0 publishes after its rounds."""
    me = tl.program_id(0)
    tag = T.step_tag(ctl, 0)
    base = T.peer_data(peers, 0)
    one = tl.arange(0, 1)
    end = 2 * rounds
    if me > 1:
        T.poll(base + end + one, one == 0, tag, ctl, health, peers, 0, 1, region, end, CPU)
    for i in range(0, rounds * (me < 2)):
        if me == 0:
            T.publish(base + 2 * i + one, one + i + 1, tag, one == 0, "gpu")
            T.poll(
                base + 2 * i + 1 + one,
                one == 0,
                tag,
                ctl,
                health,
                peers,
                0,
                1,
                region,
                2 * i + 1,
                CPU,
            )
        else:
            T.poll(base + 2 * i + one, one == 0, tag, ctl, health, peers, 0, 1, region, 2 * i, CPU)
            T.publish(base + 2 * i + 1 + one, one + i + 1, tag, one == 0, "gpu")
    if me == 0:
        T.publish(base + end + one, one, tag, one == 0, "gpu")


_SPIN_BUDGET = tl.constexpr(1 << 24)  # polls per launch for the variants (seconds at most)
_DEADLINE = tl.constexpr(P.CTL_DEADLINE)
_MAX_RANKS = tl.constexpr(P.MAX_RANKS)
_VALUE_WAY = tl.constexpr(len(P.ACQUIRE_WAYS))  # `_fanout`'s way with pairs that are the data


@triton.jit
def _spin(ptr, tag, budget):
    """The floor of a wait: volatile loads of one pair until it carries `tag`; no clock, no
    alarms, bounded by a poll budget shared by the whole launch. Returns the budget left
    (0: gave up, and every later spin of the launch gives up at once)."""
    seen = tl.load(ptr, volatile=True)
    while (T.pair_tag(seen) != tag) & (budget > 0):
        budget -= 1
        seen = tl.load(ptr, volatile=True)
    return budget


@triton.jit
def _ping_pong_floor(ctl, peers, fails, rounds, SEM: tl.constexpr):
    """`_ping_pong` with bare spins and an exchange of semantics SEM ("release" as the
    protocol, "relaxed" to see what the fence costs; relaxed is not a correct publish).
    A launch that ran out of polls adds 1 to `fails`."""
    me = tl.program_id(0)
    tag = T.step_tag(ctl, 0)
    base = T.peer_data(peers, 0)
    budget = tl.full((), _SPIN_BUDGET, tl.int64)
    for i in range(0, rounds):
        if me == 0:
            tl.atomic_xchg(base + 2 * i, T.make_pair(tag, i + 1), sem=SEM, scope="gpu")
            budget = _spin(base + 2 * i + 1, tag, budget)
        else:
            budget = _spin(base + 2 * i, tag, budget)
            tl.atomic_xchg(base + 2 * i + 1, T.make_pair(tag, i + 1), sem=SEM, scope="gpu")
    if budget <= 0:
        tl.atomic_add(fails, 1)


@triton.jit
def _wait_every(
    ptr, tag, ctl, peers, world, budget, CLOCK_EVERY: tl.constexpr, ALARM_EVERY: tl.constexpr
):
    """`T.poll`'s wait on one pair with the clock read every CLOCK_EVERY polls and the
    alarm words (a 64-lane load and a CTA max) every ALARM_EVERY polls, to time what each
    costs. Bounded by the deadline and by the launch's poll budget; returns the budget left
    (0 on any give-up)."""
    head = tl.load(peers).to(tl.pointer_type(tl.int32))
    ranks = tl.arange(0, _MAX_RANKS)
    deadline = tl.load(ctl + _DEADLINE)
    t0 = T.clock(0, False)
    waited = t0 - t0
    raised = 0
    it = 0
    seen = tl.load(ptr, volatile=True)
    while (T.pair_tag(seen) != tag) & (raised == 0) & (waited <= deadline) & (budget > 0):
        it += 1
        budget -= 1
        seen = tl.load(ptr, volatile=True)
        if it % ALARM_EVERY == 0:
            raised = tl.max(tl.load(head + ranks, mask=ranks < world, other=0, volatile=True), 0)
        if it % CLOCK_EVERY == 0:
            waited = T.clock(it, False) - t0
    return tl.where((T.pair_tag(seen) == tag) & (raised == 0), budget, 0)


@triton.jit
def _ping_pong_every(
    ctl, peers, fails, rounds, world, CLOCK_EVERY: tl.constexpr, ALARM_EVERY: tl.constexpr
):
    """`_ping_pong` with `_wait_every` waits and the protocol's release publish."""
    me = tl.program_id(0)
    tag = T.step_tag(ctl, 0)
    base = T.peer_data(peers, 0)
    one = tl.arange(0, 1)
    budget = tl.full((), _SPIN_BUDGET, tl.int64)
    for i in range(0, rounds):
        if me == 0:
            T.publish(base + 2 * i + one, one + i + 1, tag, one == 0, "gpu")
            budget = _wait_every(
                base + 2 * i + 1, tag, ctl, peers, world, budget, CLOCK_EVERY, ALARM_EVERY
            )
        else:
            budget = _wait_every(
                base + 2 * i, tag, ctl, peers, world, budget, CLOCK_EVERY, ALARM_EVERY
            )
            T.publish(base + 2 * i + 1 + one, one + i + 1, tag, one == 0, "gpu")
    if budget <= 0:
        tl.atomic_add(fails, 1)


@triton.jit
def _fanout(
    ctl, health, peers, stamps, count, rounds, region, WORDS: tl.constexpr, WAY: tl.constexpr
):
    """A stage's hand-off to every program waiting for it. Each round program 0 publishes
    WORDS done pairs (release exchanges, as `ticket_finish`); every other program waits for
    all of them as a later stage's item does (`poll`, the acquire way WAY, the barrier),
    stamps its clock and counts itself in `count`; program 0 starts the next round once
    all have. WAY len(ACQUIRE_WAYS): the pairs are the data (`publish_value`'s relaxed
    stores, as a push), so no release and no acquire. stamps[r, 0]: round r's publish
    clock, stamps[r, p]: program p's return."""
    me = tl.program_id(0)
    n = tl.num_programs(0)
    tag = T.step_tag(ctl, 0)
    base = T.peer_data(peers, 0)
    i = tl.arange(0, WORDS)
    budget = tl.full((), _SPIN_BUDGET, tl.int64)
    every = tl.arange(0, 128) * 0  # the counter read by every thread, decided by a CTA min
    for r in range(0, rounds):
        words = base + r * WORDS + i
        if me == 0:
            got = tl.min(tl.load(count + every, volatile=True), 0)
            while (got < r * (n - 1)) & (budget > 0):
                budget -= 1
                got = tl.min(tl.load(count + every, volatile=True), 0)
            tl.store(stamps + r * n, T.clock(0, False))
            if WAY == _VALUE_WAY:
                T.publish_value(words, i, tag, i >= 0, "gpu")
            else:
                T.publish(words, i, tag, i >= 0, "gpu")
        else:
            T.poll(words, i >= 0, tag, ctl, health, peers, 0, 1, region, r * WORDS, False)
            if WAY != _VALUE_WAY:
                T.acquire(words, i >= 0, WAY)
            tl.debug_barrier()
            tl.store(stamps + r * n + me, T.clock(0, False))
            tl.atomic_add(count, 1, sem="relaxed", scope="gpu")


@triton.jit
def _push(ctl, peers, ROWS: tl.constexpr, WAY: tl.constexpr):
    """Program i publishes pairs [i * 256, (i + 1) * 256) of ROWS rows (row stride: every
    program's pairs) with the step's tag: WAY 0 `publish_value` at system scope (as the
    kernels push), 1 the same at device scope, 2 relaxed 64-bit exchanges at system scope
    (publish_value's way before stop 44, still its way on AMD)."""
    tag = T.step_tag(ctl, 0)
    q = tl.program_id(0) * 256 + tl.arange(0, 256)
    rows = tl.arange(0, ROWS)[:, None]
    ptrs = T.peer_data(peers, 0) + rows * (256 * tl.num_programs(0)) + q[None, :]
    payload = (rows * 65536 + q[None, :]).to(tl.int32)
    every = (rows >= 0) & (q[None, :] >= 0)  # the pointers' full shape (see publish_value)
    if WAY == 0:
        T.publish_value(ptrs, payload, tag, every, "sys")
    elif WAY == 1:
        T.publish_value(ptrs, payload, tag, every, "gpu")
    else:
        tl.atomic_xchg(ptrs, T.make_pair(tag, payload), mask=every, sem="relaxed", scope="sys")


@triton.jit
def _empty(tickets):
    pass


@triton.jit
def _tickets(ctl, health, peers, tickets, done, n_items, lag, region, CPU: tl.constexpr):
    """A ticket loop of n_items; item t waits for item t - lag (none when lag == 0)."""
    tag = T.step_tag(ctl, 1)
    t = T.ticket_take(tickets + 1, n_items)
    while t < n_items:
        if (lag > 0) & (t >= lag):
            T.ticket_wait(done, t - lag, tag, ctl, health, peers, 0, 1, region, CPU)
        T.ticket_finish(done, t, tag)
        t = T.ticket_take(tickets + 1, n_items)


def _graph_ns(runner: MonoRunner, launch, per_graph: int, replays: int) -> float:
    """ns per launch: `per_graph` (step_begin + launch) pairs captured once, replayed."""
    launch()  # compile outside capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(per_graph):
            runner.step_begin()
            launch()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    runner.after_step()
    return start.elapsed_time(end) * 1e6 / (replays * per_graph)


def _trip_ns(runner: MonoRunner, launch, rounds: int, repeats: int = 3) -> float:
    """ns per round trip of `launch(n)` (a 2-program ping-pong of n rounds): the best of
    `repeats` timed launches of 2R rounds minus that of R rounds, over R, so neither the
    launch nor a compile is counted. Each round count is launched once untimed first, with
    the arguments the timed launches use."""
    best = {}
    for n in (rounds, 2 * rounds):
        runner.step_begin()
        launch(n)  # compile this specialization outside the timing
        runner.after_step()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            runner.step_begin()  # a fresh tag: the pair positions of the last launch are stale
            start.record()
            launch(n)
            end.record()
            end.synchronize()
            runner.after_step()
            times.append(start.elapsed_time(end) * 1e6)
        best[n] = min(times)
    return (best[2 * rounds] - best[rounds]) / rounds


def _fanouts(
    runner: MonoRunner, waiters: tuple[int, ...], region: int, rounds: int = 200, words: int = 32
) -> list[tuple[str, float]]:
    """[(what, ns)]: for each count of waiters, each acquire way and pairs that carry the
    data themselves, the median over rounds of the time from a stage's publish until its
    last waiter's wait returned (`_fanout`), and of its mean waiter's; raises if any wait
    gave up."""
    a, peers = runner.launch_args(), runner.peer.addresses
    rows = []
    for n in waiters:
        ways = [f"done pairs, acquire by {w}" for w in P.ACQUIRE_WAYS]
        for way, name in enumerate(ways + ["the data's own pairs (no release, no acquire)"]):
            stamps = torch.zeros(rounds, n + 1, dtype=torch.int64, device=runner.device)
            count = torch.zeros(1, dtype=torch.int32, device=runner.device)
            runner.step_begin()
            _fanout[(n + 1,)](
                a["ctl"], a["health"], peers, stamps, count, rounds, region, WORDS=words, WAY=way
            )
            runner.after_step()
            lag = (stamps[:, 1:] - stamps[:, :1]).double()
            last = lag.max(dim=1).values.median().item()
            mean = lag.mean(dim=1).median().item()
            what = f"hand-off of {words} pairs to {n} waiting programs, {name}"
            rows += [(f"{what}: the last", last), (f"{what}: the mean", mean)]
    return rows


def _variants(runner: MonoRunner, rounds: int, region: int) -> list[tuple[str, float]]:
    """[(variant, one-way ns)] of the ping-pong; raises if any variant's wait gave up."""
    a, peers = runner.launch_args(), runner.peer.addresses
    fails = torch.zeros(1, dtype=torch.int32, device=runner.device)

    def protocol(warps):
        return lambda n: _ping_pong[(2,)](
            a["ctl"], a["health"], peers, n, region, CPU=False, num_warps=warps
        )

    def floor(sem, warps):
        return lambda n: _ping_pong_floor[(2,)](a["ctl"], peers, fails, n, SEM=sem, num_warps=warps)

    def every(clock, alarm, warps):
        return lambda n: _ping_pong_every[(2,)](
            a["ctl"], peers, fails, n, 1, CLOCK_EVERY=clock, ALARM_EVERY=alarm, num_warps=warps
        )

    cases = [
        ("T.poll + T.publish, 4 warps (as measured by default)", protocol(4)),
        ("T.poll + T.publish, 1 warp", protocol(1)),
        ("floor: bare spin + release xchg, 1 warp", floor("release", 1)),
        ("floor: bare spin + release xchg, 4 warps", floor("release", 4)),
        ("floor: bare spin + relaxed xchg (no fence; not a protocol), 1 warp", floor("relaxed", 1)),
        ("poll, clock + alarms every poll, 4 warps", every(1, 1, 4)),
        ("poll, clock every 64 polls, alarms every poll, 4 warps", every(64, 1, 4)),
        ("poll, clock every poll, alarms every 64 polls, 4 warps", every(1, 64, 4)),
        ("poll, clock + alarms every 64 polls, 4 warps", every(64, 64, 4)),
        ("poll, clock + alarms every 64 polls, 1 warp", every(64, 64, 1)),
    ]
    rows = [(what, _trip_ns(runner, launch, rounds) / 2) for what, launch in cases]
    if int(fails.item()):
        raise RuntimeError(
            f"bench_protocol: {int(fails.item())} variant launches ran out of "
            "polls or saw an alarm; the variant table means nothing"
        )
    return rows


_PUSH_PROGRAMS = 12  # as many as the FFN's push items
_PUSH_WAYS = {
    0: f"publish_value (MONO_PUBLISH={P.publish_way()}), system scope",
    1: f"publish_value (MONO_PUBLISH={P.publish_way()}), device scope",
    2: "relaxed 64-bit exchanges, system scope",
}


def pushed(words: torch.Tensor, rows: int, programs: int) -> bool:
    """Whether `_push` left every pair of `rows` rows with its payload and one nonzero tag
    (`words`: the first rows * 256 * programs int64 words of the kernel data)."""
    words = words.view(rows, -1)
    tag = int(words[0, 0].item()) >> 32
    want = torch.arange(rows, device=words.device)[:, None] * 65536 + torch.arange(
        256 * programs, device=words.device
    )
    return tag != 0 and torch.equal(words & 0xFFFFFFFF, want) and not ((words >> 32) != tag).any()


def _pushes(runner: MonoRunner, programs: int = _PUSH_PROGRAMS) -> list[tuple[str, float]]:
    """[(way and rows, ns a launch over the empty launch)] of `_push`; raises if a pair
    did not land with its tag and payload."""
    a, peers = runner.launch_args(), runner.peer.addresses
    empty = _graph_ns(runner, lambda: _empty[(programs,)](runner.tickets), 20, 50)
    data = runner.peer.bytes[P.PEER_HEAD :].view(torch.int64)  # the kernel data: the pairs
    out = []
    for rows in (1, 16):
        for way, what in _PUSH_WAYS.items():
            ns = _graph_ns(
                runner, lambda r=rows, w=way: _push[(programs,)](a["ctl"], peers, r, w), 20, 50
            )
            words = data[: rows * 256 * programs]
            words.zero_()  # what the timed launches left there must not pass the check
            runner.step_begin()
            _push[(programs,)](a["ctl"], peers, rows, way)
            torch.cuda.synchronize()
            if not pushed(words, rows, programs):
                raise RuntimeError(f"bench_protocol --push: {what}, {rows} rows: pairs not landed")
            runner.after_step()
            out.append(
                (f"push {rows} x 256 pairs a program, {programs} programs: {what}", ns - empty)
            )
    return out


def run(
    programs: int | None = None,
    rounds: int = 2000,
    variants: bool = False,
    push: bool = False,
    crowds: tuple[int, ...] = (),
    fanouts: tuple[int, ...] = (),
) -> list[tuple[str, float]]:
    """[(what, ns)]; raises MonoFault if any wait gave up (then the numbers mean nothing).
    With `variants`, the ping-pong variants' one-way times follow; with `push`, the
    push table; with `crowds`, the one-way time while that many other programs poll one
    pair (does a crowd of waiters slow a hand-off it does not wait for?); with `fanouts`,
    a stage's hand-off to that many waiting programs, each acquire way (do the waiters'
    acquires of the same words slow their own hand-off?)."""
    device = torch.device("cuda")
    programs = programs or torch.cuda.get_device_properties(device).multi_processor_count
    peer_bytes = max(32 * rounds + (1 << 16), P.PEER_HEAD + 16 * 256 * 8 * _PUSH_PROGRAMS)
    runner = MonoRunner(device, None, 0, 1, 1 << 20, peer_bytes, deadline_ns=1_000_000_000)
    a, peers = runner.launch_args(), runner.peer.addresses
    done = torch.zeros(8 * programs, dtype=torch.int64, device=device)
    region = 0x5EED
    rows = []
    trip = _trip_ns(
        runner,
        lambda n: _ping_pong[(2,)](a["ctl"], a["health"], peers, n, region, CPU=False),
        rounds,
    )
    rows.append(("publish+poll round trip between 2 programs (gpu scope)", trip))
    rows.append(("publish+poll one way (half a round trip)", trip / 2))
    rows.append(
        (
            f"empty launch, {programs} programs",
            _graph_ns(runner, lambda: _empty[(programs,)](runner.tickets), 20, 50),
        )
    )
    for n_items, lag, what in (
        (programs, 0, "1 item each"),
        (4 * programs, programs, "4 items each, item t waits t-P"),
    ):
        rows.append(
            (
                f"ticket loop step, {programs} programs, {what}",
                _graph_ns(
                    runner,
                    lambda n=n_items, g=lag: _tickets[(programs,)](
                        a["ctl"], a["health"], peers, runner.tickets, done, n, g, region, CPU=False
                    ),
                    20,
                    50,
                ),
            )
        )
    for n in crowds:
        ns = _trip_ns(
            runner,
            lambda r, g=2 + n: _ping_pong[(g,)](a["ctl"], a["health"], peers, r, region, CPU=False),
            rounds,
        )
        rows.append((f"publish+poll one way, {n} other programs polling one pair", ns / 2))
    if fanouts:
        rows += _fanouts(runner, fanouts, region)
    if variants:
        rows += [(f"one way: {what}", ns) for what, ns in _variants(runner, rounds, region)]
    if push:
        rows += _pushes(runner)
    runner.close()
    return rows


def table(rows: list[tuple[str, float]]) -> str:
    width = max(len(w) for w, _ in rows)
    lines = [f"{'what':<{width}}  {'ns':>10}", "-" * (width + 12)]
    lines += [f"{w:<{width}}  {ns:>10.0f}" for w, ns in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument(
        "--variants", action="store_true", help="also time ping-pong variants (one-way ns each)"
    )
    parser.add_argument(
        "--push", action="store_true", help="also time publishing blocks of pairs, three ways"
    )
    parser.add_argument(
        "--crowds",
        default="",
        help="comma-separated counts of programs polling one pair during the ping-pong",
    )
    parser.add_argument(
        "--fanouts",
        default="",
        help="comma-separated counts of programs waiting for one stage's done pairs",
    )
    args = parser.parse_args()
    crowds = tuple(int(n) for n in args.crowds.split(",") if n)
    fanouts = tuple(int(n) for n in args.fanouts.split(",") if n)
    print(table(run(args.programs, args.rounds, args.variants, args.push, crowds, fanouts)))


if __name__ == "__main__":
    main()
