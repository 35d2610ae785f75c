"""Greedy decode of a small model made of the kernel packages' reference layers (the
engine's path) against the same model whose layers the executor puts on the kernels.
No vLLM: the executor is engine-free, and vLLM does not install on the GPU machine.

- MiniMax-M3 shaped: a dense first layer, then sparse MoE layers whose FFN tail (from
  the unreduced o_proj output to the all-reduced MoE output) takes the FFN kernel, as
  `mono_vllm.families.minimax.FfnLayer` runs it under vLLM; the engine's tail is
  `mono_kernels_minimax.ffn.reference.ffn_reference`.
- Kimi-K3 shaped: KDA layers (K1 from AttnRes to o_proj's input, then K2 to the layer's
  output) and an MLA layer (AttnRes and a stand-in for vLLM's MLA, then K2); the engine's
  layers are `mono_kernels_kimi.kda.reference.kda_layer` and `k2.reference.k2_reference`.

GPU (`-m gpu`): 32 steps, eager and replayed from a CUDA graph captured with the plan baked
in, fed the reference's tokens; each step's logits must match the reference's and pick the
same token but for near ties. CPU: 2 steps under TRITON_INTERPRET=1 in a child process,
greedy on both sides; the tokens must be identical.
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
    """A Kimi-K3-shaped text model at TP 1, one request, plain decode, every layer a MoE
    layer (tiny experts): embedding -> layers -> logits. Each layer's selection bias puts
    its experts ahead by 2.0 (sigmoid scores lie in (0, 1)): a near tie in the top-k would
    let the kernels' fp32 sums and the reference's pick different experts, a whole expert's
    output apart (K2's own tests check the choice at its margins; here the weights of the
    chosen experts still follow the tokens). A KDA layer is AttnRes + KDA
    (K1's region), then K2's (o_proj, MLP AttnRes, latent MoE, shared experts); an MLA
    layer is AttnRes + a bf16 projection standing in for vLLM's MLA up to o_proj's input
    (the same on both paths), then K2's. Layers follow Kimi-K3's pattern: three KDA, one
    MLA. `k2=False`: o_proj alone after K1 (the K1-only model of before)."""

    def __init__(self, layers: int, device, seed: int = 0, k2: bool = True) -> None:
        from mono_kernels_kimi.config import KimiK3Config, _default_kda_layers
        from mono_kernels_kimi.k2.weights import random_weights
        from mono_kernels_kimi.kda.inputs import make_weights

        base = KimiK3Config.tiny(tp=1)
        kda = _default_kda_layers(layers + 1) if k2 else tuple(range(1, layers + 1))
        self.cfg = replace(base, num_hidden_layers=layers, kda_layers=kda)
        cfg, gen = self.cfg, torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.layers, self.k2 = layers, k2
        H, P = cfg.hidden_size, cfg.local_proj

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(device)

        self.embed = randn(VOCAB, H, scale=1.0)
        self.lm_head = randn(VOCAB, H, scale=H**-0.5 * 8)  # well-separated logits
        self.weights = [make_weights(cfg, device, gen) for _ in range(layers)]
        self.o_proj = [randn(H, P, scale=P**-0.5) for _ in range(layers)]
        self.mla = [randn(P, H, scale=H**-0.5) for _ in range(layers)]  # MLA's stand-in
        self.moe = [random_weights(cfg, seed=seed + 10 + i, device=device) for i in range(layers)]
        for w in self.moe:  # each layer's experts chosen by a wide margin (see below)
            pick = torch.randperm(cfg.num_experts, generator=gen)[: cfg.num_experts_per_token]
            w.bias.copy_(torch.zeros(cfg.num_experts).index_fill_(0, pick, 2.0))
        self.slots = torch.tensor([1], dtype=torch.int32, device=device)  # 0: null block
        self.rows = torch.zeros(1, dtype=torch.int64, device=device)  # K2: row 0, live

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

    def mla_core(self, i, prefix, delta, blocks):
        """The MLA layer up to o_proj's input: vLLM's AttnRes, then the stand-in."""
        from mono_kernels_kimi.kda.reference import attn_res

        cfg, w = self.cfg, self.weights[i]
        nb, wi = cfg.attn_res_blocks(i)
        x = attn_res(prefix, delta, blocks, w["ares_norm"], w["ares_qk"], w["in_norm"], nb, wi,
                     cfg.rms_norm_eps, cfg.rms_norm_eps)  # fmt: skip
        return (x.float() @ self.mla[i].float().t()).to(torch.bfloat16)

    def reference_layer(self, i, prefix, delta, blocks, caches):
        """The engine's layer: (its output, the prefix after it)."""
        from mono_kernels_kimi.k2.reference import k2_reference
        from mono_kernels_kimi.kda.reference import kda_layer

        if self.cfg.is_kda_layer(i):
            args = self.layer_args(i, prefix, delta, blocks, caches)
            core = kda_layer(self.cfg, w=self.weights[i], L=1, **args)
        else:
            core = self.mla_core(i, prefix, delta, blocks)
        if not self.k2:
            return (core.float() @ self.o_proj[i].float().t()).to(torch.bfloat16), prefix
        got = k2_reference(self.cfg, [core], prefix, blocks, [self.moe[i]], i)
        return got.out, got.prefix

    def forward(self, token, caches, executor=None):
        """Logits (fp32) of one decode step; `executor`'s plan picks each layer's path."""
        cfg = self.cfg
        token = torch.as_tensor(token, device=self.device)  # eager paths pass an int
        prefix = self.embed.index_select(0, token.reshape(1))  # no host sync: capturable
        blocks = torch.zeros(1, cfg.num_attn_res_blocks, cfg.hidden_size,
                             dtype=torch.bfloat16, device=self.device)  # fmt: skip
        delta = None
        for i in range(self.layers):
            kernel = executor.layer(i) if executor is not None else None
            run = kernel if kernel is not None else self.reference_layer
            delta, prefix = run(i, prefix, delta, blocks, caches)
        hidden = prefix.float() + delta.float()
        return hidden @ self.lm_head.float().t()

    def kernels(self):
        return ToyKimiKernels(self)


class ToyKimiKernels:
    """The executor's LayerKernels for `ToyKimi`: K1 on the KDA layers and K2 on every
    layer (as `mono_vllm.families.kimi` runs them: one runner, one step, K2's scratch past
    K1's, a block-write layer's prefix restarting in a new tensor)."""

    name = "toy Kimi-K3 K1 + K2"
    dtypes: dict[str, str] = {}
    notes = ()

    def __init__(self, model: ToyKimi) -> None:
        self.model, self.layers, self.k1, self.k2 = model, tuple(range(model.layers)), None, None

    def check(self):
        return []

    def _k1_bytes(self, widths):
        from mono_kernels_kimi.kda.runner import runner_bytes

        m = self.model
        return runner_bytes(m.cfg, m.device, 1, 1, spec=False, max_rows=max(widths))

    def runner_bytes(self, widths):
        from mono_kernels_kimi.k2.spec import K2Build, peer_bytes, scratch_bytes
        from mono_vllm.families.kimi import _k2_offset

        scratch, peer = self._k1_bytes(widths)
        if not self.model.k2:
            return scratch, peer
        k2 = sum(scratch_bytes(K2Build(self.model.cfg, w)) for w in widths)
        return _k2_offset(scratch) + k2, max(peer, peer_bytes(self.model.cfg))

    def build(self, runner, widths):
        from mono_kernels_kimi.k2.runner import K2Runner
        from mono_kernels_kimi.kda.runner import KdaRunner
        from mono_vllm.families.kimi import _k2_offset

        m = self.model
        # on the executor's runner, as the plugin does: a give-up reaches after_step
        self.k1 = KdaRunner(m.cfg, m.device, 1, spec=False, max_rows=max(widths), runner=runner)
        self.k1.warm()
        if m.k2:
            off = _k2_offset(self._k1_bytes(widths)[0])
            self.k2 = K2Runner(m.cfg, None, 0, m.device, widths, runner=runner,
                               pack=False, scratch_offset=off)  # fmt: skip
            self.k2.warm()  # pack=False: the reference path reads the same expert tensors
        last = self.layers[-1]

        def kernel_at(width):
            def kernel(i, prefix, delta, blocks, caches):
                if m.cfg.is_kda_layer(i):
                    core = torch.empty(width, m.cfg.local_proj, dtype=torch.bfloat16,
                                       device=m.device)  # fmt: skip
                    args = m.layer_args(i, prefix, delta, blocks, caches)
                    final = i == last and not m.k2
                    self.k1(width, weights=m.weights[i], out=core, final=final, **args)
                else:
                    core = m.mla_core(i, prefix, delta, blocks)
                if not m.k2:
                    return (core.float() @ m.o_proj[i].float().t()).to(torch.bfloat16), prefix
                if m.cfg.mlp_attn_res(i)[1]:  # a block-write layer: a new prefix tensor
                    prefix = prefix.clone()
                out = self.k2(core, prefix, blocks, m.moe[i], m.rows, i, final=i == last)
                return out, prefix

            return dict.fromkeys(self.layers, kernel)

        return {w: kernel_at(w) for w in widths}

    def step_begin(self, runner):
        runner.step_begin()

    def kv_key(self):
        return "bound"

    def kv_check(self):
        return []

    def close(self):
        if self.k2 is not None:
            self.k2.close()
        self.k1 = self.k2 = None


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
    """Greedy decode on the reference layers: the tokens."""
    return [int(x.argmax()) for x in reference_logits(model, steps)]


def reference_logits(model, steps):
    """Each step's logits (fp32, CPU) of a greedy decode on the reference layers."""
    caches, token, out = model.caches(), 1, []
    for _ in range(steps):
        logits = model.forward(token, caches).float().flatten()
        token = int(logits.argmax())
        out.append(logits.cpu())
    return out


def greedy_eager(model, steps):
    """Greedy decode on the kernels, eager: the tokens."""
    logits = forced_eager(model, steps)
    return [int(x.argmax()) for x in logits]


def forced_eager(model, steps, feed=None):
    """Each step's logits (fp32, CPU) on the kernels, eager, fed `feed`'s tokens (teacher
    forcing: the token of step i is feed[i - 1]) or, without it, its own greedy picks."""
    from mono_runtime import StepMeta

    executor = _executor(model.kernels(), model.device)
    caches, token, out = model.caches(), 1, []
    for i in range(steps):
        assert executor.plan(StepMeta(**DECODE)) is not None
        logits = model.forward(token, caches, executor)
        executor.finish(logits)
        executor.after_step()
        out.append(logits.float().flatten().cpu())
        token = feed[i] if feed is not None else int(logits.argmax())
    executor.close()
    return out


def forced_graph(model, feed):
    """Each step's logits (fp32, CPU) from one decode step captured in a CUDA graph with
    the plan baked in, replayed, fed `feed`'s tokens."""
    from mono_runtime import StepMeta

    executor = _executor(model.kernels(), model.device)
    caches = model.caches()
    token = torch.ones((), dtype=torch.int64, device=model.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        executor.plan(StepMeta(**DECODE))
        logits = model.forward(token, caches, executor)
        executor.finish(logits)
    torch.cuda.current_stream().wait_stream(stream)
    for state in caches:  # the capture ran nothing: states start from zero as elsewhere
        for t in state:
            t.zero_()
    out = []
    for nxt in feed:
        graph.replay()
        executor.after_step()
        out.append(logits.float().flatten().cpu())
        token.fill_(nxt)
    executor.close()
    return out


def assert_decodes_alike(tokens, ref_logits, logits, where):
    """Step by step, fed the same tokens: logits within 5% (rel L2) of the reference's (the
    KDA state carries each step's rounding into the next), and the same greedy pick unless
    the reference's own pick leads the kernels' by under 1% of its logits' spread (a near
    tie that a different fp32 summation order may flip)."""
    assert len(logits) == len(tokens), where
    for i, (want, ref, got) in enumerate(zip(tokens, ref_logits, logits, strict=True)):
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 5e-2, f"{where} step {i}: logits rel {err:.2e}"
        pick = int(got.argmax())
        lead = ((ref[want] - ref[pick]) / ref.std()).item()
        assert pick == want or lead < 1e-2, (
            f"{where} step {i}: picked {pick}, not {want} (lead {lead:.2e})"
        )


def _gemma_add_norm(h, residual, weight, eps):
    """vLLM's GemmaRMSNorm with a residual: (normed, new residual), bf16."""
    x = h.float() + residual.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return normed.to(torch.bfloat16), x.to(torch.bfloat16)


class ToyMiniMax:
    """A MiniMax-M3-shaped text model at TP 1: a dense first layer, then sparse MoE
    layers of [Gemma add-norm, a stand-in for attention, the FFN tail]. The stand-in mixes
    the layer's input with the one it saw at the previous step (its "KV cache"), so the
    decode does not just cycle through a few tokens. As in `ToyKimi`, each layer's
    correction bias puts its top-k experts ahead by 2.0: with random biases the k-th and
    (k+1)-th scores came within 1e-5 to 1e-3 (CPU, 32 steps), and on the H200 the bf16
    decode's logits came 15% apart at step 30 (stop 37; likely such a flip between the GPU
    reference's fp32 sums and the kernel's: the interpreter matched the CPU reference bit
    for bit over all 32 steps)."""

    def __init__(self, layers: int, device, fmt: str = "mxfp4", seed: int = 0) -> None:
        from mono_kernels_minimax.config import MiniMaxM3Config
        from mono_kernels_minimax.ffn.weights import random_weights
        from mono_kernels_minimax.formats import WeightFormat

        self.cfg = replace(MiniMaxM3Config.tiny(), num_hidden_layers=layers, first_dense_layers=1)
        cfg, gen = self.cfg, torch.Generator().manual_seed(seed)
        self.device, self.fmt, self.layers = torch.device(device), WeightFormat(fmt), layers
        H = cfg.hidden_size

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(device)

        self.embed = randn(VOCAB, H, scale=1.0)
        self.lm_head = randn(VOCAB, H, scale=H**-0.5 * 8)
        self.dense = randn(H, H, scale=H**-0.5)
        self.in_norm = [randn(H, scale=0.1) for _ in range(layers)]
        self.attn = [randn(H, H, scale=H**-0.5) for _ in range(layers)]
        self.memory = [randn(H, H, scale=H**-0.5) for _ in range(layers)]
        self._caches: list[torch.Tensor] = []
        self.final_norm = randn(H, scale=0.1)
        self.weights = {
            i: random_weights(cfg, 1, self.fmt, seed=seed + i, device=device)
            for i in range(1, layers)
        }
        for w in self.weights.values():  # each layer's experts chosen by a wide margin
            pick = torch.randperm(cfg.num_experts, generator=gen)[: cfg.top_k]
            w.bias.copy_(torch.zeros(cfg.num_experts).index_fill_(0, pick, 2.0))
        self.slots = torch.arange(1, dtype=torch.int64, device=device)

    def caches(self):
        H = self.cfg.hidden_size
        return [torch.zeros(1, H, dtype=torch.bfloat16, device=self.device)
                for _ in range(self.layers)]  # fmt: skip

    def front(self, i):
        def run(positions, hidden, residual):
            x, residual = _gemma_add_norm(hidden, residual, self.in_norm[i], self.cfg.rms_norm_eps)
            seen = self._caches[i]
            part = x.float() @ self.attn[i].float().t() + seen.float() @ self.memory[i].float().t()
            seen.copy_(x)
            return part.to(torch.bfloat16), residual

        return run

    def reference_layer(self, i):
        from mono_kernels_minimax.ffn.reference import ffn_reference

        def run(positions, hidden, residual):
            part, residual = self.front(i)(positions, hidden, residual)
            got = ffn_reference(self.cfg, [part], residual, [self.weights[i]], self.slots)
            return got.out, got.residual

        return run

    def forward(self, token, caches, executor=None):
        cfg, self._caches = self.cfg, caches
        token = torch.as_tensor(token, device=self.device)  # eager paths pass an int
        residual = self.embed.index_select(0, token.reshape(1))  # no host sync: capturable
        hidden = (residual.float() @ self.dense.float().t()).to(torch.bfloat16)  # dense layer 0
        for i in range(1, self.layers):
            kernel = executor.layer(i) if executor is not None else None
            run = kernel if kernel is not None else self.reference_layer(i)
            hidden, residual = run(None, hidden, residual)
        x, _ = _gemma_add_norm(hidden, residual, self.final_norm, cfg.rms_norm_eps)
        return x.float() @ self.lm_head.float().t()

    def kernels(self):
        return ToyFfnKernels(self)


class ToyFfnKernels:
    """The executor's LayerKernels for `ToyMiniMax`: the FFN kernel on every MoE layer,
    through the FfnLayer seam vLLM's layers use."""

    name = "toy MiniMax-M3 FFN"
    dtypes: dict[str, str] = {}
    notes = ()

    def __init__(self, model: ToyMiniMax) -> None:
        self.model, self.layers, self.ffn = model, tuple(range(1, model.layers)), None

    def check(self):
        return []

    def runner_bytes(self, widths):
        from mono_kernels_minimax.ffn.spec import FfnBuild, peer_bytes, scratch_bytes

        m = self.model
        builds = [FfnBuild(m.cfg, w, 1, m.fmt) for w in widths]
        return sum(scratch_bytes(b) for b in builds), peer_bytes(m.cfg, 1)

    def build(self, runner, widths):
        from mono_kernels_minimax.ffn.runner import FfnRunner
        from mono_vllm.families.minimax import FfnLayer

        m, last = self.model, self.layers[-1]
        # pack=False, as the plugin: the toy's own layers read the same expert tensors
        ffn = self.ffn = FfnRunner(
            m.cfg, m.fmt, None, 0, 1, m.device, widths, runner=runner, pack=False
        )
        ffn.warm()

        def launch(i):
            return lambda part, res, slots: ffn(part, res, m.weights[i], slots, final=i == last)

        layer = {i: FfnLayer(m.front(i), launch(i), lambda: m.slots, False, 0) for i in self.layers}
        return dict.fromkeys(widths, layer)

    def step_begin(self, runner):
        self.ffn.step_begin()

    def kv_key(self):
        return "bound"

    def kv_check(self):
        return []

    def close(self):
        self.ffn = None


def _cpu_run(rank, world, group, which):
    # sizes the interpreter runs in seconds: three KDA layers and an MLA one, each with its
    # MoE, or one MoE layer after the dense
    model = ToyKimi(layers=4, device="cpu") if which == "kimi" else ToyMiniMax(2, "cpu")
    steps = 2
    return greedy_reference(model, steps), greedy_eager(model, steps)


@pytest.mark.timeout(280)
@pytest.mark.parametrize("which", ["minimax", "kimi"])
def test_toy_decode_on_the_kernels_cpu(which):
    reference, mono = spawn(_cpu_run, 1, 260, which, env=ENV)[0]
    assert mono == reference, (mono, reference)


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "make",
    [
        lambda: ToyMiniMax(layers=6, device="cuda", fmt="mxfp4"),
        lambda: ToyMiniMax(layers=6, device="cuda", fmt="bf16"),
        lambda: ToyKimi(layers=8, device="cuda"),
        lambda: ToyKimi(layers=4, device="cuda", k2=False),
    ],
    ids=["minimax-mxfp4", "minimax-bf16", "kimi-k1-k2", "kimi-k1"],
)
def test_toy_greedy_32_steps_alike_gpu(make):
    model = make()
    ref = reference_logits(model, 32)
    tokens = [int(x.argmax()) for x in ref]
    assert len(set(tokens)) > 1  # the decode went somewhere
    assert_decodes_alike(tokens, ref, forced_eager(model, 32, tokens), "eager")
    assert_decodes_alike(tokens, ref, forced_graph(model, tokens), "graph")
