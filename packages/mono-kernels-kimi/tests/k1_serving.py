"""Rank bodies of test_k1_faults.py: K1 served as the plugin serves it, in child processes
(mono_peer.testing.spawn, TRITON_INTERPRET=1), with a fault injected mid-serving.

Wiring as in `mono_vllm.families.kimi` and its executor: the rank's MonoRunner sized by
`runner_bytes`, a KdaRunner on it; per step `step_begin()`, one K1 launch per KDA layer
(the last one `final`), `guard(hidden)` after the layer loop, `after_step()` before the
logits; after a MonoFault, `reset()` on every rank. `Server` runs on a GPU too
(test_k1_gpu.py).
"""

from __future__ import annotations

import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.inputs import make_inputs

TILING = dict(programs=3, block_h=32, block_n=16, block_k=32, split_k=2, block_v=8)
LAYERS = (3, 4)  # a delta layer and a block-write layer of the tiny model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Server:
    """One rank serving K1 on two KDA layers, R requests x L tokens, as the plugin does."""

    def __init__(
        self, group, rank: int, world: int, R: int = 1, L: int = 1, device: str = "cpu"
    ) -> None:
        from mono_kernels_kimi.kda.runner import KdaRunner, runner_bytes
        from mono_runtime.runner import MonoRunner

        self.cfg, self.R, self.L, self.device = KimiK3Config.tiny(), R, L, device
        spec = L > 1
        tiling = TILING if device == "cpu" else {}
        scratch, peer = runner_bytes(self.cfg, device, L, world, spec=spec, **tiling)
        self.mono = MonoRunner(device, group, rank, world, scratch, peer)
        self.k1 = KdaRunner(self.cfg, device, L, spec=spec, runner=self.mono, **tiling)
        self.inputs = [
            make_inputs(self.cfg, R, L, spec=spec, layer_idx=i, seed=10 * i + rank, device=device)
            for i in LAYERS
        ]

    def forward(self, layers) -> torch.Tensor:
        """The step on `layers` (LayerInputs, updated in place): the guarded hidden states.
        Graph-capturable."""
        self.k1.step_begin()
        for n, x in enumerate(layers):
            self.k1(self.R, final=n == len(layers) - 1, **x.k1_kwargs())
        # the layer loop's output: any finite function of the layers' outputs
        hidden = torch.stack([x.out.float() for x in layers]).sum(0).nan_to_num()
        self.mono.guard(hidden)
        return hidden

    def after_step(self) -> str | None:
        """The MonoFault's text, or None. Waits for the device first: serving reads the
        host-visible health word without a sync and raises at the first step that sees it."""
        from mono_runtime.errors import MonoFault

        if self.device != "cpu":
            torch.cuda.synchronize()
        try:
            self.mono.after_step()
        except MonoFault as err:
            return str(err)
        return None

    def measure(self, got, hidden, fault) -> dict:
        """What a client would get (the guarded hidden states), whether after_step raised,
        and the layers' outputs and caches against the reference."""
        refs = [x.clone() for x in self.inputs]
        wants = [r.reference() for r in refs]
        return dict(
            fault=fault,
            hidden_finite=bool(torch.isfinite(hidden).all()),
            hidden_nan=bool(torch.isnan(hidden).all()),
            out_err=max(rel(x.out, w) for x, w in zip(got, wants, strict=True)),
            out_nan=[bool(torch.isnan(x.out.float()).any()) for x in got],
            state_err=max(rel(x.state, r.state) for x, r in zip(got, refs, strict=True)),
            # a layer whose waits gave up writes no recurrent or conv state
            state_kept=[
                torch.equal(x.state, i.state) and torch.equal(x.conv_state, i.conv_state)
                for x, i in zip(got, self.inputs, strict=True)
            ],
        )

    def step(self) -> dict:
        """One decode step on fresh copies of the layers' inputs, measured."""
        got = [x.clone() for x in self.inputs]
        hidden = self.forward(got)
        return self.measure(got, hidden, self.after_step())

    def close(self) -> None:
        self.k1.close()
        self.mono.close()


def lost_item(rank, world, group):
    """A give-up mid-serving on one rank: step 1 is served; in step 2 ticket 0 of the
    second launch (tag slot 1) was drawn by a program that died, so K1's mix items wait
    for an ares item that never arrives; after reset() step 3 is served again."""
    from mono_runtime.runner import CPU_NS_PER_POLL

    server = Server(group, rank, world, R=1, L=2)
    try:
        out = [server.step()]
        server.mono.set_deadline(20 * CPU_NS_PER_POLL)
        server.mono.tickets[1] = 1
        out.append(server.step())
        server.k1.reset()
        out.append(server.step())
        out.append(int(server.mono.tickets.abs().sum()))
        return out
    finally:
        server.close()


def late_rank(rank, world, group, late: int):
    """Fault injection: rank `late` stalls past the deadline before the TP fault handshake
    of step 2's final launch; every rank raises in that step, every rank's hidden states
    are poisoned; after inject(None) and reset(), step 3 is served on every rank."""
    import torch.distributed as dist
    from mono_runtime.runner import CPU_NS_PER_POLL

    server = Server(group, rank, world)
    try:
        dist.barrier(group)  # interpreters start at different speeds: the handshake waits
        out = [server.step()]
        server.k1.inject(late, 2_000 * CPU_NS_PER_POLL)
        server.mono.set_deadline(100 * CPU_NS_PER_POLL)  # same on every rank
        dist.barrier(group)
        out.append(server.step())
        server.k1.inject(None)
        server.k1.reset()
        server.mono.set_deadline(5_000 * CPU_NS_PER_POLL)
        dist.barrier(group)
        out.append(server.step())
        return out
    finally:
        server.close()
