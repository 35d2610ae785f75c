"""The stock Kimi-K3 MoE layer from o_proj's input to the layer's output, in plain torch:
K2's oracle and, with ``exact=False`` on a GPU, the op-by-op baseline of its benchmark.

Each step follows the vLLM 0.33 code named here (vllm/models/kimi_k3/nvidia/), including
where the stock path rounds to bf16 (every hand-off between two of its kernels):

    o_proj    `RowParallelLinear` (reduce_results): each rank's bf16 GEMM output, summed
              over ranks (rank order, fp32) -> bf16
    AttnRes   `KimiDecoderLayer._post_attn_norm` -> `attn_res` (ops/attn_res.py): a
              block-write layer restarts the prefix at the o_proj output, any other adds
              it to the prefix (bf16); softmax mix over the blocks and the prefix, then
              `post_attention_layernorm` -> the MoE input x (bf16)
    router    `KimiMoE.gate` (GateLinear, bf16 weight, fp32 logits); `grouped_topk`
              with one group = mono_runtime.routing.sigmoid_topk
    latent    `routed_expert_down_proj` (bf16 out)
    experts   MXFP4 w13 over the latent (fp32 accumulation), `SituAndMul` in fp32, the
              intermediate rounded to bf16 (vLLM's intermediate cache), w2; the routed
              terms of one rank accumulated in fp32 (topk weights applied), rounded once
    tail      `LatentMoERunner._overlap_allreduce_tail`: the latent all-reduce, then
              `routed_expert_norm` (ir.ops.rms_norm: normalized in fp32, rounded, times
              the bf16 weight), `torch.mm` with the replicated up_proj (bf16 out), plus
              the all-reduced shared experts (`KimiMLP`: bf16 gate_up, SiTU, bf16 down)

Padding rows (`live` False) write nothing: their prefix is left as it was and their
output is 0; they join no expert.

`acc` is the accumulation dtype of every float step (fp32 as the kernels; fp64 shows how
far fp32 accumulation itself is from the exact math).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from mono_runtime.routing import sigmoid_topk

from ..config import KimiK3Config
from ..kda.reference import attn_res
from .weights import K2Weights

BF16 = torch.bfloat16


@dataclass
class K2Result:
    out: torch.Tensor  # [S, H] bf16: the layer's output (all-reduced), 0 on padding rows
    prefix: torch.Tensor  # [S, H] bf16: the AttnRes prefix after this layer
    x: torch.Tensor  # [S, H] bf16: the MoE input (post_attention_layernorm of the mix)
    topk_ids: torch.Tensor  # [S, K] int64 (-1 on padding rows)
    topk_weights: torch.Tensor  # [S, K] fp32 (0 on padding rows)
    latent: torch.Tensor  # [S, LAT] bf16: the normed latent the up-projection reads


def linear(x: torch.Tensor, w: torch.Tensor, acc: torch.dtype, exact: bool) -> torch.Tensor:
    """x w^T rounded to bf16, as a bf16 GEMM leaves it (`exact`: accumulated in `acc`)."""
    if exact:
        return (x.to(acc) @ w.to(acc).t()).to(BF16)
    return torch.nn.functional.linear(x.to(BF16), w)


def rank_ordered_sum(parts: Sequence[torch.Tensor], acc: torch.dtype) -> torch.Tensor:
    """Sum of the ranks' tensors added in rank order in `acc`: what every rank computes."""
    total = parts[0].to(acc)
    for p in parts[1:]:
        total = total + p.to(acc)
    return total


def situ(gate_up: torch.Tensor, beta: float, linear_beta: float | None = None) -> torch.Tensor:
    """`SituAndMul.forward_native`: beta tanh(g / beta) sigmoid(g) * lb tanh(u / lb) on
    the [gate | up] halves, in the input's float dtype (no `linear_beta`: up unclipped)."""
    d = gate_up.shape[-1] // 2
    g, u = gate_up[..., :d], gate_up[..., d:]
    if linear_beta is not None:
        u = linear_beta * torch.tanh(u / linear_beta)
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * u


def k3_situ(cfg: KimiK3Config, gate_up: torch.Tensor) -> torch.Tensor:
    """SiTU with Kimi-K3's betas (routed and shared experts alike)."""
    return situ(gate_up, cfg.activation_situ_beta, cfg.activation_situ_linear_beta)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, acc: torch.dtype) -> torch.Tensor:
    """`ir.ops.rms_norm` (vllm/ir/ops/layernorm.py): normalized in float, rounded to the
    weight's dtype, times the weight."""
    xf = x.to(acc)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(w.dtype) * w


def routed_partial(
    cfg: KimiK3Config,
    latent: torch.Tensor,
    ids: torch.Tensor,
    topw: torch.Tensor,
    w: K2Weights,
    live: torch.Tensor,
    acc: torch.dtype,
) -> torch.Tensor:
    """One rank's unreduced routed output in the latent space (bf16 [S, LAT])."""
    total = torch.zeros(latent.shape, dtype=acc, device=latent.device)
    for e in ids[live].unique().tolist():  # each chosen expert dequantized alone
        rows = (ids == e).any(-1) & live
        we = (topw * (ids == e)).sum(-1)[rows].to(acc)
        h = k3_situ(cfg, latent[rows].to(acc) @ w.dense("w13", e).to(acc).t()).to(BF16)
        total[rows] += we[:, None] * (h.to(acc) @ w.dense("w2", e).to(acc).t())
    return total.to(BF16)


def shared_partial(
    cfg: KimiK3Config, x: torch.Tensor, w: K2Weights, acc: torch.dtype, exact: bool
) -> torch.Tensor:
    """One rank's unreduced shared-expert output (bf16 [S, H])."""
    gate_up = linear(x, w.shared_w13, acc, exact)
    return linear(k3_situ(cfg, gate_up.to(acc)).to(BF16), w.shared_w2, acc, exact)


def k2_reference(
    cfg: KimiK3Config,
    cores: Sequence[torch.Tensor],
    prefix: torch.Tensor,
    blocks: torch.Tensor,
    weights: Sequence[K2Weights],
    layer_idx: int,
    live: torch.Tensor | None = None,
    acc: torch.dtype = torch.float32,
    exact: bool = True,
) -> K2Result:
    """The layer over every rank: `cores[r]` ([S, Ko] bf16, o_proj's input) and
    `weights[r]` are rank r's; `prefix` [S, H] and `blocks` [S, >= sources, H] (bf16) are
    the AttnRes state every rank holds alike. Nothing passed in is modified."""
    s = prefix.shape[0]
    live = torch.ones(s, dtype=torch.bool, device=prefix.device) if live is None else live
    live = live.to(prefix.device)
    w0 = weights[0]
    parts = [linear(c, w.o_proj, acc, exact) for c, w in zip(cores, weights, strict=True)]
    o = rank_ordered_sum(parts, acc).to(BF16)
    sources, reset = cfg.mlp_attn_res(layer_idx)
    new_prefix = o.clone() if reset else prefix.clone()
    x = attn_res(
        new_prefix,
        None if reset else o,
        blocks.clone(),
        w0.mlp_res_norm,
        w0.mlp_res_proj,
        w0.post_norm,
        sources,
        -1,
        cfg.rms_norm_eps,
        cfg.rms_norm_eps,
    )
    logits = x.to(acc) @ w0.router.to(acc).t()
    ids, topw = sigmoid_topk(
        logits, w0.bias, cfg.num_experts_per_token, cfg.routed_scaling_factor, cfg.moe_renormalize
    )
    latent_in = linear(x, w0.latent_down, acc, exact)
    routed = [routed_partial(cfg, latent_in, ids, topw, w, live, acc) for w in weights]
    latent = rank_ordered_sum(routed, acc).to(BF16)
    if cfg.latent_moe_use_norm:
        latent = rms_norm(latent, w0.latent_norm, cfg.rms_norm_eps, acc)
    up = linear(latent, w0.up_proj, acc, exact)
    shared = rank_ordered_sum([shared_partial(cfg, x, w, acc, exact) for w in weights], acc)
    out = (up.to(acc) + shared.to(BF16).to(acc)).to(BF16)
    keep = live[:, None]
    return K2Result(
        out=torch.where(keep, out, torch.zeros_like(out)),
        prefix=torch.where(keep, new_prefix, prefix),
        x=x,
        topk_ids=torch.where(keep, ids, torch.full_like(ids, -1)),
        topk_weights=torch.where(keep, topw, torch.zeros_like(topw)).float(),
        latent=latent,
    )
