"""The Kimi-K3 family's K2 side, without a GPU or a served model: K2's config read from
vLLM's loaded text config, the refusals, and one loaded MoE layer's weights as K2Weights
(zero-copy views of vLLM's tensors, in vLLM's attribute names)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2.weights import random_weights
from mono_vllm.families.kimi import MOE_FIELDS, k2_reasons, k2_weights, kernel_config

pytestmark = pytest.mark.timeout(60)


def text_config(cfg: KimiK3Config, **changes) -> NS:
    kda = {"num_heads": cfg.kda_num_heads, "head_dim": cfg.kda_head_dim,
           "short_conv_kernel_size": 4, "kda_layers": list(cfg.kda_layers)}  # fmt: skip
    fields = {f: getattr(cfg, f) for f in MOE_FIELDS}
    fields |= dict(
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        rms_norm_eps=cfg.rms_norm_eps, attn_res_block_size=cfg.attn_res_block_size,
        linear_attn_config=kda, hidden_act="situ", moe_router_activation_func="sigmoid",
        use_grouped_topk=True, num_expert_group=1, topk_group=1,
    )  # fmt: skip
    return NS(**(fields | changes))


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


def loaded_layer(w) -> NS:
    """A stand-in for vLLM's loaded KimiDecoderLayer with a KimiMoE, holding `w`."""
    experts = NS(
        w13_weight=_param(w.w13), w13_weight_scale=_param(w.w13_scale),
        w2_weight=_param(w.w2), w2_weight_scale=_param(w.w2_scale),
    )  # fmt: skip
    moe = NS(
        experts=NS(routed_experts=experts),
        gate=NS(weight=_param(w.router), e_score_correction_bias=_param(w.bias)),
        routed_expert_down_proj=NS(weight=_param(w.latent_down)),
        routed_expert_norm=NS(weight=_param(w.latent_norm)),
        routed_expert_up_proj=NS(weight=_param(w.up_proj)),
        shared_experts=NS(gate_up_proj=NS(weight=_param(w.shared_w13)),
                          down_proj=NS(weight=_param(w.shared_w2))),
    )  # fmt: skip
    return NS(
        mlp=moe,
        self_attn=NS(o_proj=NS(weight=_param(w.o_proj))),
        mlp_res_norm=NS(weight=_param(w.mlp_res_norm)),
        mlp_res_proj=NS(weight=_param(w.mlp_res_proj[None])),
        post_attention_layernorm=NS(weight=_param(w.post_norm)),
    )


def test_config_reads_the_moe_fields():
    cfg = KimiK3Config.tiny(2)
    got = kernel_config(text_config(cfg), 2, cfg.in_proj_rows)
    for f in MOE_FIELDS:
        assert getattr(got, f) == getattr(cfg, f), f
    assert k2_reasons(text_config(cfg), 2) == []


def test_weights_are_views_of_vllms():
    cfg = KimiK3Config.tiny(2)
    w = random_weights(cfg, seed=1)
    got = k2_weights(loaded_layer(w))
    got.validate(cfg)
    for name, t in w.tensors().items():
        assert getattr(got, name).data_ptr() == t.data_ptr(), name
    own = {"w13": w.w13.clone(), "w13_scale": w.w13_scale, "w2": w.w2, "w2_scale": w.w2_scale}
    assert k2_weights(loaded_layer(w), own).w13.data_ptr() == own["w13"].data_ptr()


def test_refusals_name_the_setting():
    cfg = KimiK3Config.tiny(1)
    bad = text_config(
        cfg, hidden_act="silu", moe_router_activation_func="softmax", num_expert_group=8,
        latent_moe_use_norm=False, num_shared_experts=0, moe_renormalize=False,
    )  # fmt: skip
    assert k2_reasons(bad, 1) == [
        "a latent MoE without its RMSNorm",
        "a MoE without shared experts",
        "activation silu (K2: situ)",
        "router softmax (K2: sigmoid)",
        "top-k weights without renormalization",
        "grouped top-k over 8 groups (K2: one group)",
    ]
    assert k2_reasons(text_config(cfg, num_experts=None), 1)[0] == "a model without MoE layers"
    assert k2_reasons(text_config(cfg), 3) == [
        "num_experts 16 not split over TP 3",
        "routed_expert_hidden_size 64 not split over TP 3",
        "moe_intermediate_size 32 not split over TP 3",
    ]
