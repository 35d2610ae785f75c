"""MoE expert selection as the stock path computes it, in plain torch: every kernel's
router is tested against this one definition.

vLLM 0.33 routes MiniMax-M3 (`fused_topk_bias`, sigmoid branch) and Kimi-K3
(`grouped_topk` with one group, fused_moe/router/grouped_topk_router.py) the same way:
scores = sigmoid(logits); the top k of scores + correction bias are chosen; their weights
are the unbiased scores, renormalized to sum 1 and times the routed scaling factor. Ties
in the selection key go to the lower expert id and NaN keys rank last (this project's
rule; torch.topk leaves both unspecified).
"""

from __future__ import annotations

import torch


def sigmoid_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    scaling: float = 1.0,
    renormalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [S, k] int64, weights [S, k] in the logits' float dtype, at least fp32) of
    fp32-or-wider `logits` [S, E] and `bias` [E]."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scores = torch.sigmoid(logits.to(dtype))
    key = scores + bias.to(dtype)
    key = torch.where(torch.isnan(key), torch.full_like(key, float("-inf")), key)
    # a stable descending sort: equal keys keep ascending expert order
    ids = torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids, w * scaling
