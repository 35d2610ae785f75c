"""What the protocol costs on a GPU, in ns: one publish+poll round trip between two programs,
and one step of a 132-program ticket loop (next to an empty launch of the same grid).

Run on the GPU machine: `python3 -m mono_runtime.bench_protocol` (prints a table), or call
`run()` from tools/gpu_run.py. Times come from CUDA graphs of many launches, so launch
overhead is amortised the way a captured decode step amortises it.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from . import protocol_triton as T
from .runner import MonoRunner


@triton.jit
def _ping_pong(ctl, health, peers, rounds, region, CPU: tl.constexpr):
    """Program 0 publishes round i, program 1 polls it and answers; program 0 polls the
    answer. Every round uses fresh pair positions with the step's tag: a real tagged
    exchange through L2, two one-way messages a round."""
    me = tl.program_id(0)
    tag = T.step_tag(ctl, 0)
    base = T.peer_data(peers, 0)
    one = tl.arange(0, 1)
    for i in range(0, rounds):
        if me == 0:
            T.publish(base + 2 * i + one, one + i + 1, tag, one == 0, "gpu")
            T.poll(base + 2 * i + 1 + one, one == 0, tag, ctl, health, peers, 0, 1, region,
                   2 * i + 1, CPU)
        else:
            T.poll(base + 2 * i + one, one == 0, tag, ctl, health, peers, 0, 1, region,
                   2 * i, CPU)
            T.publish(base + 2 * i + 1 + one, one + i + 1, tag, one == 0, "gpu")


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


def run(programs: int | None = None, rounds: int = 2000) -> list[tuple[str, float]]:
    """[(what, ns)]; raises MonoFault if any wait gave up (then the numbers mean nothing)."""
    device = torch.device("cuda")
    programs = programs or torch.cuda.get_device_properties(device).multi_processor_count
    runner = MonoRunner(device, None, 0, 1, 1 << 20, 16 * rounds + (1 << 16),
                        deadline_ns=1_000_000_000)
    a, peers = runner.launch_args(), runner.peer.addresses
    done = torch.zeros(8 * programs, dtype=torch.int64, device=device)
    region = 0x5EED
    rows = []
    runner.step_begin()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _ping_pong[(2,)](a["ctl"], a["health"], peers, 4, region, CPU=False)  # compile
    runner.after_step()
    runner.reset()
    runner.step_begin()
    start.record()
    _ping_pong[(2,)](a["ctl"], a["health"], peers, rounds, region, CPU=False)
    end.record()
    end.synchronize()
    runner.after_step()
    trip = start.elapsed_time(end) * 1e6 / rounds
    rows.append(("publish+poll round trip between 2 programs (gpu scope)", trip))
    rows.append(("publish+poll one way (half a round trip)", trip / 2))
    rows.append((f"empty launch, {programs} programs",
                 _graph_ns(runner, lambda: _empty[(programs,)](runner.tickets), 20, 50)))
    for n_items, lag, what in ((programs, 0, "1 item each"),
                               (4 * programs, programs, "4 items each, item t waits t-P")):
        rows.append((f"ticket loop step, {programs} programs, {what}", _graph_ns(
            runner, lambda n=n_items, g=lag: _tickets[(programs,)](
                a["ctl"], a["health"], peers, runner.tickets, done, n, g, region, CPU=False),
            20, 50)))
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
    args = parser.parse_args()
    print(table(run(args.programs, args.rounds)))


if __name__ == "__main__":
    main()
