"""The per-model families' layer selection and refusals, over backbones shaped like vLLM's
(the attribute names of vLLM 0.33's MiniMax-M3 and Kimi-K3 modules; no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import torch
from mono_vllm.deployment import Deployment
from mono_vllm.families.kimi import KimiKdaKernels
from mono_vllm.families.minimax import MiniMaxFfnKernels, ffn_weights

DEPLOY = Deployment(architecture="x", tp=1)


def _param(t):
    return torch.nn.Parameter(t, requires_grad=False)


def minimax_backbone(fmt="bf16", **text_changes):
    """Two layers: a dense one, then a sparse MoE layer holding `random_weights` under the
    names vLLM's MiniMaxM3DecoderLayer / MiniMaxM3MoE / FusedMoE give them."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn.weights import random_weights
    from mono_kernels_minimax.formats import WeightFormat

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, 1, WeightFormat(fmt))
    experts = NS(w13_weight=_param(w.w13), w2_weight=_param(w.w2))
    if w.w13_scale is not None:
        experts.w13_weight_scale, experts.w2_weight_scale = _param(w.w13_scale), _param(w.w2_scale)
    moe = NS(
        experts=experts,
        gate=NS(weight=_param(w.router)),
        e_score_correction_bias=_param(w.bias),
        shared_experts=NS(
            gate_up_proj=NS(weight=_param(w.shared_w13)), down_proj=NS(weight=_param(w.shared_w2))
        ),
    )
    sparse = NS(
        is_moe_layer=True,
        block_sparse_moe=moe,
        post_attention_layernorm=NS(weight=_param(w.norm)),
        self_attn=NS(layer_name="model.layers.1.self_attn.attn", kv_cache=torch.tensor([])),
    )
    text = NS(
        hidden_size=cfg.hidden_size, num_hidden_layers=2, moe_layer_freq=[0, 1],
        num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k,
        intermediate_size=cfg.moe_intermediate_size, n_shared_experts=1,
        dense_intermediate_size=cfg.dense_intermediate_size,
        routed_scaling_factor=cfg.routed_scaling_factor, swiglu_alpha=cfg.swiglu_alpha,
        swiglu_beta=cfg.swiglu_beta, swiglu_limit=cfg.swiglu_limit, rms_norm_eps=1e-6,
        hidden_act="swigluoai", scoring_func="sigmoid", use_routing_bias=True,
    )  # fmt: skip
    text.__dict__.update(text_changes)
    return NS(config=text, start_layer=0, end_layer=2, layers=[NS(is_moe_layer=False), sparse])


def test_minimax_takes_the_sparse_moe_layers_and_reads_vllms_weights():
    for fmt in ("bf16", "mxfp4"):
        family = MiniMaxFfnKernels(minimax_backbone(fmt), DEPLOY, 0, 1)
        assert family.layers == (1,) and family.metadata_key == "model.layers.1.self_attn.attn"
        assert family.check() == [], fmt
        assert ffn_weights(family.backbone.layers[1]).fmt.value == fmt
        assert family.kv_key() is None  # nothing bound yet
    bound = minimax_backbone()
    bound.layers[1].self_attn.kv_cache = torch.zeros(4, 8)
    assert (
        MiniMaxFfnKernels(bound, DEPLOY, 0, 1).kv_key()
        == bound.layers[1].self_attn.kv_cache.data_ptr()
    )


def test_minimax_refusals():
    family = MiniMaxFfnKernels(
        minimax_backbone(scoring_func="softmax", hidden_act="gelu"), DEPLOY, 0, 1
    )
    assert family.check()[:2] == [
        "activation gelu (kernel: swigluoai)",
        "router softmax (kernel: sigmoid)",
    ]
    backbone = minimax_backbone()
    backbone.aux_hidden_state_layers = (1,)
    assert MiniMaxFfnKernels(backbone, DEPLOY, 0, 1).check() == ["EAGLE-3 auxiliary hidden states"]
    family = MiniMaxFfnKernels(minimax_backbone(), DEPLOY, 0, 2)  # weights of TP 1 at TP 2
    (reason,) = family.check()
    assert reason.startswith("loaded weights: weights.w13: shape"), reason


def kimi_backbone(conv_dtype=torch.bfloat16, in_proj_rows=None, **kda_changes):
    from mono_kernels_kimi.config import KimiK3Config

    cfg = KimiK3Config.tiny(tp=1)
    kda = {"num_heads": cfg.kda_num_heads, "head_dim": cfg.kda_head_dim,
           "short_conv_kernel_size": 4, "use_full_rank_gate": True,
           "kda_layers": list(cfg.kda_layers), **kda_changes}  # fmt: skip
    text = NS(
        hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        rms_norm_eps=1e-6, attn_res_block_size=cfg.attn_res_block_size, linear_attn_config=kda,
        is_kda_layer=lambda i: (i + 1) in kda["kda_layers"],
    )  # fmt: skip

    def layer(i):
        rows = in_proj_rows or cfg.in_proj_rows
        states = [torch.zeros(3, cfg.qkv_dim, 3, dtype=conv_dtype), torch.zeros(3, 2, 16, 16)]
        attn = NS(prefix=f"model.layers.{i}.self_attn", kv_cache=states,
                  in_proj_qkvgfab=NS(weight=torch.zeros(rows, cfg.hidden_size)))  # fmt: skip
        return NS(self_attn=attn)

    layers = [layer(i) for i in range(cfg.num_hidden_layers)]
    return NS(config=text, start_layer=0, end_layer=cfg.num_hidden_layers, layers=layers)


def test_kimi_takes_the_kda_layers():
    family = KimiKdaKernels(kimi_backbone(), DEPLOY, 0, 1)
    assert family.layers == (0, 1, 2, 4, 5, 6)  # 1-based kda_layers skip every 4th
    assert family.metadata_key == "model.layers.0.self_attn"
    assert family.check() == [] and family.kv_check() == []
    assert family.kv_key() == family.backbone.layers[0].self_attn.kv_cache[1].data_ptr()


def test_kimi_refusals():
    family = KimiKdaKernels(kimi_backbone(use_full_rank_gate=False), DEPLOY, 0, 3)
    assert family.check() == ["KDA without the full-rank gate", "KDA heads not split over TP 3"]
    family = KimiKdaKernels(kimi_backbone(in_proj_rows=100), DEPLOY, 0, 1)
    (reason,) = family.check()
    assert reason.startswith("loaded weights: in_proj has 100 rows, K1 expects"), reason
    family = KimiKdaKernels(kimi_backbone(conv_dtype=torch.float16), DEPLOY, 0, 1)
    assert family.kv_check() == ["KDA conv state dtype torch.float16: needs bf16"]
