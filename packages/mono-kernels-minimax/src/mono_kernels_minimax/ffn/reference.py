"""Plain-torch MiniMax-M3 FFN tail: the oracle every build is tested against.

It is the stock math of one sparse decoder layer from the unreduced o_proj output to the
MoE output, as vLLM 0.33 computes it (vllm/models/minimax_m3/nvidia/model.py):

    seam     `MiniMaxM3DecoderLayer.forward` -> `fused_allreduce_gemma_rms_norm`: all-reduce of
             the partials (bf16 result), + residual in fp32 -> new residual (bf16), Gemma
             RMSNorm of the fp32 sum (`GemmaRMSNorm.forward_native` / `ir.ops.fused_add_rms_norm`:
             x * rsqrt(mean(x^2) + eps) * (1 + w), w in fp32) -> bf16
    router   `MiniMaxM3MoE.gate` = `GateLinear(params_dtype=fp32, out_dtype=fp32)`: fp32 logits
             of the bf16 activations upcast to fp32
    route    `fused_topk_bias` (fused_moe/router/fused_topk_bias_router.py, the torch path of
             `scoring_func="sigmoid"`): scores = sigmoid(logits); top-k of scores + bias;
             weights = scores of the chosen / their sum (renormalize=True) * routed_scaling_factor
    experts  activation "swigluoai_uninterleave" = `SiluAndMulWithClamp.forward_native`
             (model_executor/layers/activation.py): gate = min(g, limit),
             up = clamp(u, -limit, limit), gate * sigmoid(alpha * gate) * (up + beta), on the
             un-interleaved [gate | up] halves of w13
    shared   `MiniMaxM3MLP` of intermediate_size * n_shared_experts, same activation, added with
             weight 1 (`MoERunner`: shared_output + routed output; the routed scale is on the
             routed side only)
    reduce   the rank partials summed (the next layer's fused all-reduce)

Top-k tie rule (this project's, stated in the issue): equal selection keys go to the lower
expert id and NaN keys rank last. Rounding points (identical in the kernels): the seam as
above; expert intermediates rounded to bf16 (vLLM's bf16 intermediate cache); one fp32
accumulation of every expert term of a rank, rounded to bf16 once (vLLM rounds each expert's
output to bf16 before its weighted sum: a difference below bf16 resolution of the result);
rank sums in rank order in fp32, rounded to bf16.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from mono_runtime.routing import sigmoid_topk

from ..config import MiniMaxM3Config
from .spec import Experts
from .weights import FfnWeights


@dataclass
class FfnResult:
    out: torch.Tensor  # [S, H] bf16, the all-reduced MoE output
    residual: torch.Tensor  # [S, H] bf16, the new residual
    normed: torch.Tensor  # [S, H] bf16, the MoE input
    topk_ids: torch.Tensor  # [S, K] int64 (-1 on padding rows)
    topk_weights: torch.Tensor  # [S, K] fp32 (0 on padding rows)


def rank_ordered_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """fp32 sum of the ranks' tensors, added in rank order (what every rank computes)."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc


def seam(cfg: MiniMaxM3Config, parts, residual, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed bf16, new residual bf16) from the ranks' unreduced o_proj outputs."""
    reduced = rank_ordered_sum(parts).to(torch.bfloat16)
    x = reduced.float() + residual.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
    normed = (x * rstd * (norm.float() + 1.0)).to(torch.bfloat16)
    return normed, x.to(torch.bfloat16)


def route(cfg: MiniMaxM3Config, normed, router, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [S, K] int64, topk_weights [S, K] fp32)."""
    logits = normed.float() @ router.float().t()
    ids, w = sigmoid_topk(logits, bias, cfg.top_k, cfg.routed_scaling_factor)
    return ids, w.float()


def swiglu_oai(cfg: MiniMaxM3Config, gate_up: torch.Tensor) -> torch.Tensor:
    d = gate_up.shape[-1] // 2
    gate = gate_up[..., :d].clamp(max=cfg.swiglu_limit)
    up = gate_up[..., d:].clamp(min=-cfg.swiglu_limit, max=cfg.swiglu_limit)
    return gate * torch.sigmoid(cfg.swiglu_alpha * gate) * (up + cfg.swiglu_beta)


def mlp(cfg: MiniMaxM3Config, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """fp32 output of one gate|up -> SwiGLU-OAI -> down MLP on fp32 dense weights."""
    h = swiglu_oai(cfg, x.float() @ w13.t()).to(torch.bfloat16).float()
    return h @ w2.t()


def rank_partial(
    cfg: MiniMaxM3Config,
    normed: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w: FfnWeights,
    live: torch.Tensor,
    experts: Experts = Experts.ALL,
) -> torch.Tensor:
    """This rank's unreduced MoE output (bf16 [S, H]); rows with live=False give zeros."""
    acc = torch.zeros(normed.shape, dtype=torch.float32, device=normed.device)
    if experts is not Experts.SHARED:
        w13, w2 = w.dense("w13"), w.dense("w2")
        for e in ids[live].unique().tolist():
            rows = (ids == e).any(-1) & live
            we = (weights * (ids == e)).sum(-1)[rows]
            y = mlp(cfg, normed[rows], w13[e], w2[e])
            acc[rows] += we[:, None] * y
    if experts is not Experts.ROUTED:
        y = mlp(cfg, normed, w.dense("shared_w13"), w.dense("shared_w2"))
        acc += torch.where(live[:, None], y, torch.zeros_like(y))
    return acc.to(torch.bfloat16)


def ffn_reference(
    cfg: MiniMaxM3Config,
    parts: Sequence[torch.Tensor],
    residual: torch.Tensor,
    weights: Sequence[FfnWeights],
    slots: torch.Tensor | None = None,
    experts: Experts = Experts.ALL,
) -> FfnResult:
    """The layer's FFN tail over every rank: `parts[r]` and `weights[r]` are rank r's.
    A row whose slot is negative (graph padding) runs the seam and gets a zero MoE output."""
    normed, new_residual = seam(cfg, parts, residual, weights[0].norm)
    ids, topw = route(cfg, normed, weights[0].router, weights[0].bias)
    live = torch.ones(normed.shape[0], dtype=torch.bool, device=normed.device)
    if slots is not None:
        live = slots.to(normed.device) >= 0
    partials = [rank_partial(cfg, normed, ids, topw, w, live, experts) for w in weights]
    out = rank_ordered_sum(partials).to(torch.bfloat16)
    ids = torch.where(live[:, None], ids, torch.full_like(ids, -1))
    topw = torch.where(live[:, None], topw, torch.zeros_like(topw))
    return FfnResult(out, new_residual, normed, ids, topw)
