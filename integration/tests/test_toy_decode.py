"""Greedy decode of a small model made of the kernel packages' reference layers (the
engine's path) against the same model whose layers the executor puts on the kernels.
No vLLM: the executor is engine-free, and vLLM does not install on the GPU machine.

- Kimi-K3 shaped: every layer a KDA layer (K1 from AttnRes to o_proj's input, then a
  bf16 o_proj); the engine's layer is `mono_kernels_kimi.kda.reference.kda_layer`.
- (MiniMax-M3 shaped: see test_toy_decode_minimax in this module once FfnRunner lands.)

GPU (`-m gpu`): 32 steps, eager and replayed from a CUDA graph captured with the plan baked
in; tokens must be identical. CPU: the same code for 3 steps of 2 layers under
TRITON_INTERPRET=1 in a child process.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from mono_peer.testing import spawn

VOCAB = 64
ENV = {"TRITON_INTERPRET": "1"}
DECODE = {"num_reqs": 1, "query_lens": (1,), "num_prefills": 0, "num_decodes": 1,
          "num_spec_verifies": 0, "kv_bound": True}  # fmt: skip


class ToyKimi:
    """A Kimi-K3-shaped text model of `layers` KDA layers at TP 1, one request, plain
    decode: embedding -> [AttnRes + KDA (K1's region), o_proj] x layers -> logits."""

    def __init__(self, layers: int, device, seed: int = 0) -> None:
        from mono_kernels_kimi.config import KimiK3Config
        from mono_kernels_kimi.kda.inputs import make_weights

        base = KimiK3Config.tiny(tp=1)
        self.cfg = replace(base, num_hidden_layers=layers, kda_layers=tuple(range(1, layers + 1)))
        cfg, gen = self.cfg, torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.layers = layers
        H, P = cfg.hidden_size, cfg.local_proj

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(device)

        self.embed = randn(VOCAB, H, scale=1.0)
        self.lm_head = randn(VOCAB, H, scale=H**-0.5 * 8)  # well-separated logits
        self.weights = [make_weights(cfg, device, gen) for _ in range(layers)]
        self.o_proj = [randn(H, P, scale=P**-0.5) for _ in range(layers)]
        self.slots = torch.tensor([1], dtype=torch.int32, device=device)  # 0: null block

    def caches(self):
        """Fresh KDA states per layer: conv [slots, dim, 3] bf16, recurrent fp32."""
        cfg, dev = self.cfg, self.device
        return [
            (
                torch.zeros(2, cfg.qkv_dim, 3, dtype=torch.bfloat16, device=dev),
                torch.zeros(2, cfg.local_heads, cfg.kda_head_dim, cfg.kda_head_dim, device=dev),
            )
            for _ in range(self.layers)
        ]

    def layer_args(self, i, prefix, delta, blocks, caches):
        nb, wi = self.cfg.attn_res_blocks(i)
        conv, state = caches[i]
        return dict(
            prefix=prefix, delta=delta, blocks=blocks, num_blocks=nb, write_idx=wi,
            conv_state=conv, state=state, state_indices=self.slots, num_accepted=None,
        )  # fmt: skip

    def reference_layer(self, i, prefix, delta, blocks, caches):
        from mono_kernels_kimi.kda.reference import kda_layer

        args = self.layer_args(i, prefix, delta, blocks, caches)
        return kda_layer(self.cfg, w=self.weights[i], L=1, **args)

    def forward(self, token, caches, executor=None):
        """Logits (fp32) of one decode step; `executor`'s plan picks each layer's path."""
        cfg = self.cfg
        prefix = self.embed[token].reshape(1, -1).clone()
        blocks = torch.zeros(1, cfg.num_attn_res_blocks, cfg.hidden_size,
                             dtype=torch.bfloat16, device=self.device)  # fmt: skip
        delta = None
        for i in range(self.layers):
            kernel = executor.layer(i) if executor is not None else None
            run = kernel if kernel is not None else self.reference_layer
            core = run(i, prefix, delta, blocks, caches)
            delta = (core.float() @ self.o_proj[i].float().t()).to(torch.bfloat16)
        hidden = prefix.float() + delta.float()
        return hidden @ self.lm_head.float().t()


class ToyK1Kernels:
    """The executor's LayerKernels for `ToyKimi`: K1 on every layer."""

    name = "toy Kimi-K3 K1"
    dtypes: dict[str, str] = {}

    def __init__(self, model: ToyKimi) -> None:
        self.model, self.layers, self.k1 = model, tuple(range(model.layers)), None

    def check(self):
        return []

    def runner_bytes(self, widths):
        return 8, 8

    def build(self, runner, width):
        from mono_kernels_kimi.kda.runner import KdaRunner

        m = self.model
        if self.k1 is None:
            self.k1 = KdaRunner(m.cfg, m.device, 1, spec=False, max_rows=1)
            self.k1.warm()

        def kernel(i, prefix, delta, blocks, caches):
            out = torch.empty(1, m.cfg.local_proj, dtype=torch.bfloat16, device=m.device)
            args = m.layer_args(i, prefix, delta, blocks, caches)
            return self.k1(width, weights=m.weights[i], out=out, **args)

        return dict.fromkeys(self.layers, kernel)

    def kv_key(self):
        return "bound"

    def kv_check(self):
        return []

    def close(self):
        self.k1 = None


def _executor(kernels, device):
    from mono_runtime.runner import MonoRunner
    from mono_vllm.executor import MonoExecutor

    executor = MonoExecutor.build(
        kernels,
        q=1,
        widths=[1],
        group=None,
        make_runner=lambda s, p: MonoRunner(device, None, 0, 1, s, p),
    )
    executor.prepare_kv()
    return executor


def greedy_reference(model, steps):
    caches, token, out = model.caches(), 1, []
    for _ in range(steps):
        token = int(model.forward(token, caches).argmax())
        out.append(token)
    return out


def greedy_eager(model, steps):
    from mono_runtime import StepMeta

    executor = _executor(ToyK1Kernels(model), model.device)
    caches, token, out = model.caches(), 1, []
    for _ in range(steps):
        assert executor.plan(StepMeta(**DECODE)) is not None
        logits = model.forward(token, caches, executor)
        executor.finish(logits)
        executor.after_step()
        token = int(logits.argmax())
        out.append(token)
    executor.close()
    return out


def greedy_graph(model, steps):
    """One decode step captured in a CUDA graph with the plan baked in, replayed."""
    from mono_runtime import StepMeta

    executor = _executor(ToyK1Kernels(model), model.device)
    caches = model.caches()
    token = torch.ones((), dtype=torch.int64, device=model.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        executor.plan(StepMeta(**DECODE))
        logits = model.forward(token, caches, executor)
        executor.finish(logits)
        nxt = logits.argmax()
    torch.cuda.current_stream().wait_stream(stream)
    for c, s in caches:  # the capture ran nothing: states start from zero as elsewhere
        c.zero_()
        s.zero_()
    out = []
    for _ in range(steps):
        graph.replay()
        executor.after_step()
        token.copy_(nxt)
        out.append(int(nxt))
    executor.close()
    return out


def _cpu_run(rank, world, group):
    model = ToyKimi(layers=2, device="cpu")
    return greedy_reference(model, 3), greedy_eager(model, 3)


@pytest.mark.timeout(280)
def test_toy_kimi_decode_on_k1_cpu():
    reference, mono = spawn(_cpu_run, 1, 260, env=ENV)[0]
    assert mono == reference, (mono, reference)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_toy_kimi_greedy_32_steps_identical_gpu():
    model = ToyKimi(layers=4, device="cuda")
    reference = greedy_reference(model, 32)
    assert greedy_eager(model, 32) == reference
    assert greedy_graph(model, 32) == reference
    assert len(set(reference)) > 1  # the decode went somewhere
