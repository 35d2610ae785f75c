"""GPU tests (`-m gpu`): the all-reduce as one kernel on one rank and on two processes
sharing one GPU (CUDA IPC peers), fault injection there, the era fault through pinned
health, and step_begin captured in a CUDA graph replayed 1000 times."""

from __future__ import annotations

import pytest
from mono_peer.testing import spawn

pytestmark = pytest.mark.gpu
HIDDEN = 6144


def _inputs(world, rows, seed=0, device="cuda"):
    import torch

    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(rows, HIDDEN, generator=g).bfloat16() for _ in range(world)]
    residual = torch.randn(rows, HIDDEN, generator=g).bfloat16()
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16()
    return parts, residual, weight


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_allreduce_single_rank(rows):
    import torch
    from mono_runtime import MonoRunner
    from mono_runtime.allreduce import AllreduceBuild, allreduce, allreduce_reference, warm
    from mono_runtime.builds import DeviceLimits, residency_problem

    build = AllreduceBuild(rows, HIDDEN, 1, True, True)
    parts, residual, weight = _inputs(1, rows)
    with MonoRunner("cuda", None, 0, 1, build.scratch_bytes + 64, build.peer_bytes) as runner:
        for res in warm(runner, [1, rows], HIDDEN, True, True).values():
            assert res.registers > 0
            assert residency_problem(res, 132, DeviceLimits.of(runner.device)) is None
        for step in range(3):
            runner.step_begin()
            plain, _ = allreduce(runner, parts[0].cuda(), 0)
            out, rout = allreduce(runner, parts[0].cuda(), 1, residual.cuda(), weight.cuda())
            runner.after_step()
            ref, rref = allreduce_reference(parts, residual, weight)
            assert torch.equal(plain.cpu(), parts[0]), step
            assert torch.equal(rout.cpu(), rref), step
            torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)


def _two_process_child(rank, world, group):
    import torch
    from mono_runtime import MonoFault, MonoRunner
    from mono_runtime.allreduce import AllreduceBuild, allreduce

    rows = 4
    build = AllreduceBuild(rows, HIDDEN, world, True, True)
    parts, residual, weight = _inputs(world, rows)
    runner = MonoRunner(
        "cuda",
        group,
        rank,
        world,
        build.scratch_bytes + 64,
        build.peer_bytes,
        deadline_ns=10_000_000_000,
    )  # the two contexts time-slice
    log = {}
    runner.step_begin()
    log["plain"] = allreduce(runner, parts[rank].cuda(), 0, programs=8)[0].cpu()
    out, rout = allreduce(runner, parts[rank].cuda(), 1, residual.cuda(), weight.cuda(), programs=8)
    runner.after_step()
    torch.cuda.synchronize()
    log["norm"], log["res"] = out.cpu(), rout.cpu()
    # rank 1 stalls past a 50 ms deadline: both raise, then reset, then right again
    runner.set_deadline(50_000_000)
    runner.inject(1, 20_000_000_000)
    log["fault"] = None
    for _ in range(3):
        runner.step_begin()
        allreduce(runner, parts[rank].cuda(), 0, programs=8)
        torch.cuda.synchronize()
        try:
            runner.after_step()
        except MonoFault as e:
            log["fault"] = str(e)
            break
    runner.inject(None)
    runner.set_deadline(10_000_000_000)
    runner.reset()
    runner.step_begin()
    log["after"] = allreduce(runner, parts[rank].cuda(), 0, programs=8)[0].cpu()
    runner.after_step()
    runner.close()
    return log


@pytest.mark.timeout(300)
def test_allreduce_two_processes_one_gpu_with_fault():
    import torch
    from mono_runtime.allreduce import allreduce_reference

    logs = spawn(_two_process_child, 2, 280)
    parts, residual, weight = _inputs(2, 4)
    plain_ref, _ = allreduce_reference(parts)
    ref, rref = allreduce_reference(parts, residual, weight)
    for rank, log in enumerate(logs):
        assert torch.equal(log["plain"], plain_ref), rank
        assert torch.equal(log["res"], rref), rank
        torch.testing.assert_close(log["norm"], ref, atol=2e-2, rtol=2e-2)
        assert log["fault"] is not None and "rank 1" in log["fault"], (rank, log["fault"])
        assert torch.equal(log["after"], plain_ref), rank
    for key in ("plain", "norm", "res"):  # bit-identical ranks
        assert torch.equal(logs[0][key].view(torch.int16), logs[1][key].view(torch.int16))


@pytest.mark.timeout(120)
def test_era_fault_reaches_host_through_pinned_health():
    import torch
    from mono_runtime import MonoFault, MonoRunner
    from mono_runtime import protocol as P
    from mono_runtime.allreduce import allreduce

    with MonoRunner("cuda", None, 0, 1, 64, 1 << 20, deadline_ns=100_000_000) as runner:
        assert runner.health.is_pinned()
        runner.ctl[P.CTL_EPOCH] = P.ERA_STEPS  # the next step is past the era
        runner.step_begin()
        out, _ = allreduce(runner, torch.ones(2, 256, dtype=torch.bfloat16, device="cuda"), 0)
        torch.cuda.synchronize()
        assert int(runner.health[P.H_GIVEUPS]) > 0  # written by the kernel, read by the host
        with pytest.raises(MonoFault, match="outside its tag era"):
            runner.after_step()
        assert torch.isnan(out.float()).all()
        runner.reset()
        runner.step_begin()
        out, _ = allreduce(runner, torch.ones(2, 256, dtype=torch.bfloat16, device="cuda"), 0)
        runner.after_step()
        assert torch.equal(out.cpu(), torch.ones(2, 256, dtype=torch.bfloat16))


@pytest.mark.timeout(300)
def test_step_begin_in_cuda_graph_replayed_1000_times():
    import importlib.util
    from pathlib import Path

    import torch
    from mono_runtime import MonoRunner
    from mono_runtime.allreduce import allreduce

    spec = importlib.util.spec_from_file_location(
        "mono_runtime_device_kernels", Path(__file__).with_name("device_kernels.py")
    )
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    seen_kernel = kernels.seen_kernel
    n = 1000
    with MonoRunner("cuda", None, 0, 1, 64, 1 << 20) as runner:
        log = torch.zeros(n, dtype=torch.int64, device="cuda")
        x = torch.randn(3, 512, device="cuda").bfloat16()
        runner.step_begin()
        seen_kernel[(1,)](runner.ctl, log, n)  # compile outside capture
        allreduce(runner, x, 0)
        runner.reset()
        log.zero_()
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            runner.step_begin()
            seen_kernel[(1,)](runner.ctl, log, n)
            out, _ = allreduce(runner, x, 0)
        for i in range(n):
            graph.replay()
            runner.after_step()  # eager, per replay: no give-up, no sync
            if i % 250 == 0:
                assert torch.equal(out, x), i
        torch.cuda.synchronize()
        assert log.tolist() == list(range(1, n + 1))  # the kernel saw every epoch
        assert int(runner.ctl[0] - runner.ctl[1]) == n
        assert torch.equal(out, x)
