"""A GPU smoke test of mono itself, through the run script's path: a one-rank runner on the
GPU (peer memory, protocol state, pinned health words) runs the runtime's fused all-reduce +
residual + RMSNorm, and it matches the plain-torch reference on the host."""

import pytest


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_runner_and_fused_allreduce_match_the_reference():
    import torch
    from mono_runtime import MonoRunner
    from mono_runtime.allreduce import allreduce
    from mono_runtime.allreduce.reference import allreduce_reference

    g = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(2, 512, generator=g).bfloat16() for _ in range(2))
    weight = (torch.rand(512, generator=g) + 0.5).bfloat16()
    want, want_res = allreduce_reference([x], residual, weight)
    with MonoRunner("cuda", None, 0, 1, 64, 1 << 20, deadline_ns=10**9) as runner:
        assert runner.health.is_pinned() and runner.peer.backend in ("cuda", "hip")
        runner.step_begin()
        out, res = allreduce(runner, x.cuda(), 0, residual.cuda(), weight.cuda())
        torch.cuda.synchronize()
        runner.after_step()  # no give-up recorded
    assert torch.equal(res.cpu(), want_res)
    torch.testing.assert_close(out.cpu(), want, atol=2e-2, rtol=2e-2)
