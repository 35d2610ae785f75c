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


class Backend(NS):
    pass


def kimi_backbone(backend="EMULATION", pad_w2=False):
    """A tiny Kimi-K3 rank (TP 1) in vLLM's NVIDIA tree: every KDA layer a MoE layer holding
    one `random_weights` set under vLLM's names; `backend`: vLLM's MXFP4 MoE backend (None:
    not MXFP4); `pad_w2`: w2 stored wider than the checkpoint's (a backend's padding)."""
    from mono_kernels_kimi.config import KimiK3Config as Cfg

    cfg = Cfg.tiny(1)
    text = text_config(cfg)
    text.linear_attn_config["use_full_rank_gate"] = True
    text.is_kda_layer = lambda i: (i + 1) in cfg.kda_layers
    w = random_weights(cfg, seed=1)

    def layer(i):
        got = loaded_layer(w)
        routed = got.mlp.experts.routed_experts
        routed.quant_method = NS(mxfp4_backend=None if backend is None else Backend(name=backend))
        routed.moe_config = NS(intermediate_size_per_partition=cfg.routed_intermediate)
        if pad_w2:  # 32 more columns: 16 bytes of codes, one scale
            routed.w2_weight = _param(torch.nn.functional.pad(w.w2, (0, 16)))
            routed.w2_weight_scale = _param(torch.nn.functional.pad(w.w2_scale, (0, 1)))
        states = [torch.zeros(3, cfg.qkv_dim, 3, dtype=torch.bfloat16), torch.zeros(3, 2, 16, 16)]
        got.self_attn.prefix = f"model.layers.{i}.self_attn"
        got.self_attn.kv_cache = states
        got.self_attn.in_proj_qkvgfab = NS(weight=torch.zeros(cfg.in_proj_rows, cfg.hidden_size))
        got.input_layernorm = NS(weight=torch.zeros(cfg.hidden_size, dtype=torch.bfloat16))
        got.is_moe_layer = True
        return got

    cls = type("Backbone", (NS,), {"__module__": "vllm.models.kimi_k3.nvidia.model"})
    layers = [layer(i) for i in range(cfg.num_hidden_layers)]
    return cls(config=text, start_layer=0, end_layer=cfg.num_hidden_layers, layers=layers)


def test_k2_runs_on_the_moe_kda_layers_and_sizes_the_runner():
    from mono_kernels_kimi.k2.spec import peer_bytes
    from mono_vllm.deployment import Deployment
    from mono_vllm.families.kimi import KimiKdaKernels

    family = KimiKdaKernels(kimi_backbone(), Deployment(architecture="x", tp=1), 0, 1)
    assert family.kda_layers == (0, 1, 2, 4, 5, 6)  # 1-based kda_layers skip every 4th
    assert family.moe_layers == family.layers == tuple(range(8))  # K2 on the MLA layers too
    assert family.check() == [] and family.k2_off() == [] and family.notes == []
    assert family._k2_layout()[1] is False  # the checkpoint's layout: vLLM's tensors, no copy
    scratch, peer = family.runner_bytes([1, 2])
    k1_scratch, k1_peer = family._k1_bytes([1, 2])
    assert scratch > k1_scratch and peer == max(k1_peer, peer_bytes(family._config()))
    padded = KimiKdaKernels(kimi_backbone(pad_w2=True), Deployment(architecture="x", tp=1), 0, 1)
    assert padded.check() == [] and padded._k2_layout()[1] is True  # K2 unpacks its own
    assert padded.k2_off() == []  # the dry run of its copy (shapes only) passes


def test_k2_off_leaves_k1_and_says_why():
    from mono_vllm.deployment import Deployment
    from mono_vllm.families.kimi import KimiKdaKernels

    family = KimiKdaKernels(kimi_backbone(backend=None), Deployment(architecture="x", tp=1), 0, 1)
    assert family.check() == []  # K1 still runs
    assert family.k2_off() == [
        "loaded weights: routed experts not in MXFP4 (K2 streams MXFP4 experts)"
    ]
    assert family.notes == ["K2 off, the MoE layers run vLLM's: " + family.k2_off()[0]]
    assert family.runner_bytes([1]) == family._k1_bytes([1])
    assert family.layers == family.kda_layers  # the MLA layers stay vLLM's
    marlin = KimiKdaKernels(
        kimi_backbone(backend="MARLIN"), Deployment(architecture="x", tp=1), 0, 1
    )
    marlin.check()
    assert "MARLIN MoE backend" in marlin.k2_off()[0]


def test_k2_off_when_its_copy_cannot_fit(monkeypatch):
    """K2's own copy of the experts (vLLM keeps them padded here) must fit the GPU twice
    with the margin: else K2 is off with the reason and K1 still runs."""
    from mono_vllm import experts as E
    from mono_vllm.deployment import Deployment
    from mono_vllm.families.kimi import KimiKdaKernels

    monkeypatch.setattr(E, "device_memory", lambda device: E.COPY_MARGIN)  # no room at all
    family = KimiKdaKernels(kimi_backbone(pad_w2=True), Deployment(architecture="x", tp=1), 0, 1)
    assert family.check() == []  # K1 still runs
    (reason,) = family.k2_off()
    assert reason.startswith("K2's own copy of the routed experts") and "emulation" in reason
    assert family.layers == family.kda_layers
    in_place = KimiKdaKernels(kimi_backbone(), Deployment(architecture="x", tp=1), 0, 1)
    assert in_place.check() == [] and in_place.k2_off() == []  # no copy: no limit


def test_live_rows_follow_k1s_state_slots():
    from mono_vllm.families.kimi import live_rows

    assert live_rows(torch.tensor([5, 0, -1, 7]), 4).tolist() == [0, -1, -1, 3]
    assert live_rows(torch.tensor([[3, 4], [0, 0]]), 4).tolist() == [0, 1, -1, -1]


@pytest.mark.parametrize("block_write", [True, False])
def test_k2_layer_hands_the_prefix_on(block_write):
    """K1's core then K2: a block-write layer's new prefix is a new tensor (the one passed
    in keeps its values), any other layer's is the one passed in, updated."""
    from mono_vllm.families.kimi import KdaLayer, StepRows

    seen = {}

    def k2(core, prefix, blocks, slots):
        seen.update(core=core, prefix=prefix, slots=slots)
        prefix.fill_(7)
        return core * 2

    rows = StepRows()
    rows.slots = torch.tensor([0, -1])  # what the step's first KDA layer set
    layer = KdaLayer(NS(is_block_write_layer=block_write), None, 2, {}, k2=k2, rows=rows)
    core, indices = torch.ones(2, 4), torch.tensor([9, 0])
    layer.core = lambda prefix, delta, blocks: (core, indices)
    prefix = torch.zeros(2, 4)
    out, new_prefix, blocks = layer(None, "delta", "blocks", prefix_sum=prefix)
    assert torch.equal(out, core * 2) and blocks == "blocks"
    assert seen["slots"] is rows.slots and seen["prefix"] is new_prefix
    assert (new_prefix is prefix) is not block_write
    assert bool((prefix == 7).all()) is not block_write


@pytest.mark.parametrize("gated", [True, False])
def test_mla_k2_layer_runs_vllms_attention_up_to_o_proj(gated):
    """vLLM's AttnRes and MLA (q-LoRA, output gate) up to o_proj's input, then K2."""
    from mono_vllm.families.kimi import MlaK2Layer, StepRows

    seen = {}
    prefix, blocks, h = torch.zeros(2, 4), torch.ones(2, 3, 4), torch.full((2, 4), 3.0)
    attn_out, gate = torch.full((2, 6), 2.0), torch.zeros(2, 6) if gated else None

    def pre_attn_norm(delta, residual, prefix_sum):
        seen["pre"] = (delta, residual, prefix_sum)
        return h, prefix_sum, residual

    def q_lora(positions, hidden):
        seen["mla"] = (positions, hidden)
        return attn_out, gate

    def k2(core, prefix, blocks, slots):
        seen["k2"] = (core, prefix, blocks, slots)
        return core.sum(-1, keepdim=True)

    layer = NS(
        _pre_attn_norm=pre_attn_norm, is_block_write_layer=False,
        self_attn=NS(q_lora_rank=64, _forward_q_lora=q_lora),
    )  # fmt: skip
    rows = StepRows()
    rows.slots = torch.tensor([0, -1])
    out, new_prefix, new_blocks = MlaK2Layer(layer, k2, rows)("pos", "delta", blocks, prefix)
    assert seen["pre"] == ("delta", blocks, prefix) and seen["mla"] == ("pos", h)
    core = seen["k2"][0]
    assert torch.equal(core, attn_out * 0.5 if gated else attn_out)  # sigmoid(0) = 0.5
    assert seen["k2"][1] is prefix and seen["k2"][3] is rows.slots
    assert (
        new_prefix is prefix
        and new_blocks is blocks
        and torch.equal(out, core.sum(-1, keepdim=True))
    )
