"""Timing on the device, shared by every benchmark: a call's time under CUDA/HIP graph
replay (how a captured decode step runs it) and the copy bandwidth that sets the memory
limit, both measured in the run that reports them.

Arguments are checked before anything touches the device, so a bad call fails the same way
on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable


def _positive(name: str, value: int, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")


def _need_gpu(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a GPU (CUDA or HIP): torch sees none")


def graph_time(fn: Callable[[], object], reps: int = 20, warmup: int = 3, calls: int = 1) -> float:
    """Seconds per call of `fn`: `calls` back-to-back calls captured in one graph, the
    median over `reps` individually timed replays, divided by `calls`.

    `fn` runs `warmup` times on a side stream first (compiles, autotunes and allocates
    outside the capture), and the graph replays `warmup` times before timing. Pick `calls`
    (or work inside `fn`) so one replay lasts far longer than a graph launch (~10 us)."""
    if not callable(fn):
        raise ValueError(f"fn: expected a callable, got {type(fn).__name__}")
    _positive("reps", reps)
    _positive("warmup", warmup)
    _positive("calls", calls)
    _need_gpu("graph_time")
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    times.sort()
    return times[len(times) // 2] / calls


def copy_bandwidth(device=None, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes per second moved (read + written) by the faster of two device-to-device copies
    of `nbytes` (far larger than any cache), on `device` (default: the current one): the
    memcpy torch issues for `copy_` (in a graph, a copy-engine node: slower than the SMs on
    an H200) and an elementwise kernel run by the SMs. The faster one is the limit a kernel
    can approach, so it is the one a "% of the memory limit" is measured against."""
    _positive("nbytes", nbytes)
    _positive("iters", iters)
    import torch

    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: {device} is not a GPU (CUDA/HIP) device")
    _need_gpu("copy_bandwidth")
    with torch.cuda.device(device):
        src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        memcpy = graph_time(lambda: dst.copy_(src), reps=iters, warmup=2)
        kernel = graph_time(lambda: torch.neg(src, out=dst), reps=iters, warmup=2)
    return 2 * src.numel() * 4 / min(memcpy, kernel)
