"""Timing on the device: a call's time under CUDA/HIP graph replay, and the copy bandwidth
that sets the memory limit, both measured in the run that reports them."""

from __future__ import annotations

from collections.abc import Callable

CALLS_PER_GRAPH = 20  # enough back-to-back calls that the replay's own launch cost vanishes


def graph_us(fn: Callable[[], object], replays: int = 20, warmup: int = 3) -> float:
    """Median microseconds per call of `fn` captured `CALLS_PER_GRAPH` times in one graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # compiles, autotunes and allocates outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return _median_us(graph.replay, replays) / CALLS_PER_GRAPH


def _median_us(replay: Callable[[], object], replays: int) -> float:
    import torch

    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    us = graph_us(lambda: dst.copy_(src), replays=5, warmup=2)
    return 2 * nbytes / (us * 1e3)
