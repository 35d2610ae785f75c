"""The executor's lifecycle with mono_runtime's real pieces (no vLLM): build with agreed
refusals, prepare_kv, plan, the layer seam, the NaN guard and after_step, over the host
peer backend with two ranks as processes. The layer kernels are the runtime's tagged
all-reduce (an in-kernel collective with bounded waits) under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch
from mono_peer.testing import spawn
from mono_runtime import MonoUnsupported, StepMeta
from mono_vllm.executor import MonoExecutor

ENV = {"TRITON_INTERPRET": "1"}
H = 8
DEADLINE_NS = 200_000_000  # 200 polls under the interpreter
DECODE = {"num_reqs": 2, "query_lens": (1, 1), "num_prefills": 0, "num_decodes": 2,
          "num_spec_verifies": 0}  # fmt: skip
MIXED = {"num_reqs": 2, "query_lens": (1, 4), "num_prefills": 1, "num_decodes": 1,
         "num_spec_verifies": 0}  # fmt: skip


class ToyKernels:
    """Two decoder layers, each replaced by one launch of the runtime's all-reduce."""

    name = "toy all-reduce"
    layers = (0, 1)
    dtypes: dict[str, str] = {}

    def __init__(self, world: int, refusal: str | None = None) -> None:
        self.world, self.refusal = world, refusal
        self.kv: int | None = None
        self.closed = False

    def check(self) -> list[str]:
        return [self.refusal] if self.refusal else []

    def runner_bytes(self, widths):
        from mono_runtime.allreduce import AllreduceBuild

        return 8, max(AllreduceBuild(w, H, self.world).peer_bytes for w in widths)

    def build(self, runner, widths):
        from mono_runtime.allreduce import allreduce

        layer = {i: (lambda h, i=i: allreduce(runner, h, slot=i)[0]) for i in self.layers}
        return dict.fromkeys(widths, layer)

    def step_begin(self, runner):
        runner.step_begin()

    def kv_key(self):
        return self.kv

    def kv_check(self):
        return []

    def close(self):
        self.closed = True


def _stock(h, group, world):
    """The engine's layer: the same sum, by torch.distributed (rank order, fp32)."""
    import torch.distributed as dist

    parts = [torch.empty_like(h) for _ in range(world)]
    dist.all_gather(parts, h, group=group)
    total = parts[0].float()
    for p in parts[1:]:
        total = total + p.float()
    return total.to(torch.bfloat16)


def _forward(executor, h, group, world):
    for i in range(2):
        kernel = executor.layer(i)
        h = kernel(h) if kernel is not None else _stock(h, group, world)
    executor.finish(h)
    executor.after_step()
    return h


def _build(rank, world, group, refusal=None):
    from mono_runtime.runner import MonoRunner

    kernels = ToyKernels(world, refusal)
    executor = MonoExecutor.build(
        kernels,
        q=1,
        widths=[1, 2],
        group=group,
        make_runner=lambda s, p: MonoRunner("cpu", group, rank, world, s, p, DEADLINE_NS),
    )
    return kernels, executor


def _refusing_rank(rank, world, group, refuse_rank):
    try:
        _build(rank, world, group, "TP 3 not supported" if rank == refuse_rank else None)
    except MonoUnsupported as err:
        return str(err)
    return None


@pytest.mark.timeout(120)
def test_a_rank_that_refuses_makes_every_rank_refuse():
    got = spawn(_refusing_rank, 2, 90, 1, env=ENV)
    assert got[1] == "mono does not support this deployment (toy all-reduce): TP 3 not supported"
    assert got[0] == "mono does not support this deployment (toy all-reduce): another rank refused"


def _lifecycle(rank, world, group):
    from mono_runtime import MonoFault

    kernels, executor = _build(rank, world, group)
    torch.manual_seed(rank)
    x = torch.randn(2, H).to(torch.bfloat16)
    out = {}
    # before any KV cache is bound: the engine's layers
    assert executor.plan(StepMeta(**DECODE, kv_bound=executor.bound)) is None
    out["stock"] = _forward(executor, x.clone(), group, world)
    kernels.kv = 1234  # the engine bound a KV cache
    executor.prepare_kv()
    step = executor.plan(StepMeta(**DECODE, kv_bound=executor.bound))
    out["width"] = step.width
    out["mono"] = _forward(executor, x.clone(), group, world)
    assert executor.plan(StepMeta(**MIXED, kv_bound=True)) is None  # a prefill: stock
    assert executor.layer(0) is None
    _forward(executor, x.clone(), group, world)
    # rank 1 stalls past the deadline before its first peer store: a wait gives up
    executor.runner.inject(1, delay_ns=50 * DEADLINE_NS)
    executor.plan(StepMeta(**DECODE, kv_bound=True))
    h = x.clone()
    try:
        _forward(executor, h, group, world)
    except MonoFault as err:
        out["fault"] = str(err).splitlines()[0]
    out["poisoned"] = bool(torch.isnan(h.float()).all())
    executor.close()
    out["closed"] = kernels.closed
    return out


@pytest.mark.timeout(240)
def test_plan_layers_and_a_give_up_on_one_rank_raises_on_every_rank():
    got = spawn(_lifecycle, 2, 200, env=ENV)
    for rank, out in enumerate(got):
        assert out["width"] == 2
        # the kernels' all-reduce gives the engine's sums, bit for bit, on every rank
        assert torch.equal(out["mono"], out["stock"]), rank
        assert out["fault"].startswith("mono: rank"), out
        assert out["closed"]
    assert torch.equal(got[0]["mono"], got[1]["mono"])


class _Runner:
    def __init__(self):
        self.epochs, self.closed = 0, False

    def step_begin(self):
        self.epochs += 1

    def after_step(self):
        pass

    def close(self):
        self.closed = True


def test_single_rank_checks():
    kernels = ToyKernels(1)
    with pytest.raises(ValueError, match="multiples of q=2"):
        MonoExecutor.build(kernels, q=2, widths=[3], group=None, make_runner=None)
    runner = _Runner()
    executor = MonoExecutor(kernels, runner, {1: {0: "k"}}, q=1, group=None)
    kernels.kv = 1
    executor.prepare_kv()
    meta = StepMeta(1, (1,), 0, 1, 0, kv_bound=True)
    assert executor.plan(meta).layer(0) == "k" and runner.epochs == 1
    executor.finish()
    kernels.kv = 2  # re-bound behind the executor's back
    with pytest.raises(RuntimeError, match="re-bound without prepare_kv"):
        executor.plan(meta)
    executor.close()
    assert runner.closed and kernels.closed and executor.plan(meta) is None
