"""The per-model families' layer selection, refusals, expert sources and hand-offs over
backbones shaped like vLLM's, in either of its vendor trees (the attribute names of vLLM
0.33's MiniMax-M3 and Kimi-K3 modules, which test_vllm_contract.py checks against vLLM)."""

from __future__ import annotations

import enum
from types import SimpleNamespace as NS

import pytest
import torch
from mono_vllm.deployment import Deployment
from mono_vllm.families.kimi import AmdKdaLayer, KimiKdaKernels
from mono_vllm.families.minimax import (
    MiniMaxFfnKernels,
    expert_source,
    ffn_experts,
    ffn_weights,
    kernel_config,
    routed_experts,
)

DEPLOY = Deployment(architecture="x", tp=1)
TREES = ("nvidia", "amd")


class Backend(enum.Enum):  # the names of vLLM's Mxfp4MoeBackend members the plugin reads
    EMULATION = 1
    HUMMING = 2
    AITER_MXFP4_BF16 = 3
    MARLIN = 4


def from_tree(model: str, tree: str, **attrs):
    """A namespace whose class lives in vLLM's `tree` for `model`, as a backbone's does."""
    cls = type("Backbone", (NS,), {"__module__": f"vllm.models.{model}.{tree}.model"})
    return cls(**attrs)


def _param(t):
    return torch.nn.Parameter(t, requires_grad=False)


def minimax_backbone(fmt="bf16", tree="nvidia", backend=None, inter_pad=None, tp=1, **text_changes):
    """Two layers: a dense one, then a sparse MoE layer holding `random_weights` under the
    names vLLM's MiniMaxM3DecoderLayer / MiniMaxM3MoE / MoERunner / RoutedExperts give
    them (a rank of TP `tp`; ``checkpoint``: those weights). `inter_pad`: the intermediate
    size vLLM's MoE backend rounded up to."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn.weights import random_weights
    from mono_kernels_minimax.formats import WeightFormat

    cfg = MiniMaxM3Config.tiny()
    w = random_weights(cfg, tp, WeightFormat(fmt))
    i = cfg.per_rank_intermediate(tp)
    w13, w13_scale, w2, w2_scale = w.w13, w.w13_scale, w.w2, w.w2_scale
    if inter_pad:  # vLLM's loader: each w13 half at its own offset, w2 columns past I zero
        pad13 = w13.new_zeros(w13.shape[0], 2 * inter_pad, w13.shape[2])
        pad13[:, :i], pad13[:, inter_pad : inter_pad + i] = w13[:, :i], w13[:, i:]
        s13 = w13_scale.new_zeros(w13.shape[0], 2 * inter_pad, w13_scale.shape[2])
        s13[:, :i], s13[:, inter_pad : inter_pad + i] = w13_scale[:, :i], w13_scale[:, i:]
        w13, w13_scale = pad13, s13
        w2 = torch.nn.functional.pad(w2, (0, (inter_pad - i) // 2))
        w2_scale = torch.nn.functional.pad(w2_scale, (0, (inter_pad - i) // 32))
    experts = NS(
        w13_weight=_param(w13), w2_weight=_param(w2),
        quant_method=NS() if backend is None else NS(mxfp4_backend=backend),
        moe_config=NS(intermediate_size_per_partition=inter_pad or i),
    )  # fmt: skip
    if w13_scale is not None:
        experts.w13_weight_scale, experts.w2_weight_scale = _param(w13_scale), _param(w2_scale)
    moe = NS(
        experts=NS(routed_experts=experts),
        gate=NS(weight=_param(w.router)),
        e_score_correction_bias=_param(w.bias),
        shared_experts=NS(
            gate_up_proj=NS(weight=_param(w.shared_w13)), down_proj=NS(weight=_param(w.shared_w2))
        ),
        is_fused_shared_expert_enabled=False,
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
    layers = [NS(is_moe_layer=False), sparse]
    return from_tree("minimax_m3", tree, config=text, start_layer=0, end_layer=2, layers=layers,
                     checkpoint=w)  # fmt: skip


@pytest.mark.parametrize("tree", TREES)
def test_minimax_takes_the_sparse_moe_layers_and_reads_vllms_weights(tree):
    for fmt, backend in (("bf16", None), ("mxfp4", Backend.EMULATION)):
        family = MiniMaxFfnKernels(minimax_backbone(fmt, tree, backend), DEPLOY, 0, 1)
        assert family.layers == (1,) and family.metadata_key == "model.layers.1.self_attn.attn"
        assert family.check() == [], fmt
        assert ffn_weights(family.backbone.layers[1]).fmt.value == fmt
        assert not family._copies(family._source()[1])  # vLLM's tensors, read in place
        assert family.kv_key() is None  # nothing bound yet
    bound = minimax_backbone(tree=tree)
    bound.layers[1].self_attn.kv_cache = torch.zeros(4, 8)
    assert (
        MiniMaxFfnKernels(bound, DEPLOY, 0, 1).kv_key()
        == bound.layers[1].self_attn.kv_cache.data_ptr()
    )


def test_minimax_runner_bytes_fit_either_build():
    """At real sizes the Gluon build's tiles need more scratch than the Triton build's
    (80 MB against 55 MB over 16 widths at TP4): the runner the plugin makes is sized for
    whichever build it then takes."""
    from mono_kernels_minimax.ffn.spec import FfnBuild, scratch_bytes
    from mono_kernels_minimax.formats import WeightFormat

    real = dict(hidden_size=6144, num_local_experts=128, intermediate_size=3072)
    family = MiniMaxFfnKernels(minimax_backbone("mxfp4", backend=Backend.EMULATION, **real),
                               DEPLOY, 0, 4)  # fmt: skip
    cfg = kernel_config(family.backbone.config)
    widths = [1, 8, 16]
    scratch, _ = family.runner_bytes(widths)
    for frag in (False, True):
        need = sum(
            scratch_bytes(FfnBuild(cfg, s, 4, WeightFormat.MXFP4, frag=frag)) for s in widths
        )
        assert scratch >= need, frag
    assert scratch > sum(scratch_bytes(FfnBuild(cfg, s, 4, WeightFormat.MXFP4)) for s in widths)


@pytest.mark.parametrize("tree", TREES)
def test_minimax_refusals(tree):
    family = MiniMaxFfnKernels(
        minimax_backbone(tree=tree, scoring_func="softmax", hidden_act="gelu"), DEPLOY, 0, 1
    )
    assert family.check()[:2] == [
        "activation gelu (kernel: swigluoai)",
        "router softmax (kernel: sigmoid)",
    ]
    backbone = minimax_backbone(tree=tree)
    backbone.aux_hidden_state_layers = (1,)
    assert MiniMaxFfnKernels(backbone, DEPLOY, 0, 1).check() == ["EAGLE-3 auxiliary hidden states"]
    family = MiniMaxFfnKernels(minimax_backbone(tree=tree), DEPLOY, 0, 2)  # TP 1's weights
    (reason,) = family.check()
    assert reason.startswith("loaded weights: weights.w13: shape"), reason


def test_minimax_amd_refuses_the_fused_shared_expert():
    backbone = minimax_backbone(tree="amd")
    backbone.layers[1].block_sparse_moe.is_fused_shared_expert_enabled = True
    assert MiniMaxFfnKernels(backbone, DEPLOY, 0, 1).check() == [
        "the shared expert fused into the routed experts "
        "(VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1)"
    ]


def test_minimax_expert_sources():
    """Which of vLLM's MXFP4 MoE backends mono reads, and how their layouts are checked."""
    experts = routed_experts(minimax_backbone("mxfp4", backend=Backend.MARLIN).layers[1])
    with pytest.raises(ValueError, match="vLLM's MARLIN MoE backend .*--moe-backend emulation"):
        expert_source(experts)
    experts.quant_method.mxfp4_backend = Backend.AITER_MXFP4_BF16
    with pytest.raises(ValueError, match="AITER's shuffle did not rewrite"):
        expert_source(experts)
    experts.w13_weight.is_shuffled = True
    assert expert_source(experts)[1].value == "aiter-a16w4"
    experts.quant_method.mxfp4_backend = Backend.HUMMING
    bf16_act = NS(num_bits=16)
    for sm, ok in ((90, True), (100, False)):
        experts.humming_configs = {
            "w13": NS(sm_version=sm, a_dtype=bf16_act, use_fused_e8m0_scale=False)
        }
        if ok:
            assert expert_source(experts)[1].value == "humming"
        else:
            with pytest.raises(ValueError, match="HUMMING experts for sm100"):
                expert_source(experts)
    bf16 = routed_experts(minimax_backbone("bf16").layers[1])
    bf16.w13_weight.is_shuffled = True  # e.g. AITER's shuffle of unquantized experts
    with pytest.raises(ValueError, match="shuffled for AITER"):
        expert_source(bf16)


def test_minimax_copies_padded_experts_exactly():
    """vLLM's ROCm backends round the intermediate size (here 128 -> 256): the kernel gets
    a copy of its own, the checkpoint's rows and columns, bit for bit; check() dry-runs
    it on shapes only."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_runtime.stream.sources import ExpertLayout

    backbone = minimax_backbone("mxfp4", "amd", Backend.EMULATION, inter_pad=256)
    family = MiniMaxFfnKernels(backbone, DEPLOY, 0, 1)
    assert family._copies(ExpertLayout.K32) and family.check() == []
    copy = ffn_experts(
        routed_experts(backbone.layers[1]), ExpertLayout.K32, MiniMaxM3Config.tiny(), 1
    )
    for name, t in copy.items():
        assert torch.equal(t, getattr(backbone.checkpoint, name)), name
    assert copy["w13"].data_ptr() != routed_experts(backbone.layers[1]).w13_weight.data_ptr()


def test_a_copy_that_cannot_fit_is_refused_before_it_is_made(monkeypatch):
    """The kernel's own copy of the experts must fit the GPU twice (vLLM keeps its own)
    with COPY_MARGIN for the rest: else one refusal naming the size and the setting that
    avoids the copy, from shapes alone, before build allocates anything."""
    from mono_vllm import experts as E

    backbone = minimax_backbone("mxfp4", "amd", Backend.EMULATION, inter_pad=256)
    family = MiniMaxFfnKernels(backbone, DEPLOY, 0, 1)
    w = backbone.checkpoint
    copy = sum(t.nbytes for t in (w.w13, w.w13_scale, w.w2, w.w2_scale))
    monkeypatch.setattr(E, "device_memory", lambda device: 2 * copy + E.COPY_MARGIN)
    assert family.check() == []  # fits exactly
    monkeypatch.setattr(E, "device_memory", lambda device: 2 * copy + E.COPY_MARGIN - 1)
    (reason,) = family.check()
    assert reason.startswith("the FFN kernel's own copy of the routed experts (0.0 GiB a rank")
    assert reason.endswith("--moe-backend emulation keeps the checkpoint's layout, which the "
                           "FFN kernel reads in place")  # fmt: skip
    read_in_place = minimax_backbone("mxfp4", "amd", Backend.EMULATION)
    assert MiniMaxFfnKernels(read_in_place, DEPLOY, 0, 1).check() == []  # no copy: no limit


class FakeFfnRunner:
    """Stands in for FfnRunner in build(): records pack and launches."""

    def __init__(self, cfg, fmt, group, rank, world, device, widths, runner, pack):
        self.pack_mode, self.launches = pack, []

    def warm(self):
        pass

    def close(self):
        pass

    def pack(self, weights):
        return weights

    def __call__(self, part, residual, weights, slots, final):
        self.launches.append(final)
        return part + 1, residual


@pytest.mark.parametrize("tree", TREES)
def test_minimax_hand_offs_follow_vllms_tree(tree, monkeypatch):
    """NVIDIA: a kernel layer after a stock one completes that layer's deferred all-reduce
    in its input norm, and the last kernel layer hands its sum to the next all-reduce from
    rank 0 only. AMD: vLLM's MoE reduces its own output; nothing to hand over."""
    import mono_kernels_minimax.ffn.runner as ffn_runner
    import vllm.model_executor.layers.fused_allreduce_gemma_rms_norm as fused

    calls = []
    monkeypatch.setattr(ffn_runner, "FfnRunner", FakeFfnRunner)
    monkeypatch.setattr(
        fused, "fused_allreduce_gemma_rms_norm", lambda h, r, norm: calls.append("fused") or (h, r)
    )
    backbone = minimax_backbone("mxfp4", tree, Backend.EMULATION, tp=2)
    layer = backbone.layers[1]
    layer.input_layernorm = lambda h, r: calls.append("plain") or (h, r)
    layer.self_attn = type(
        "Attention",
        (),
        {"layer_name": "a", "__call__": lambda s, positions, hidden_states: hidden_states * 2},
    )()
    if tree == "nvidia":
        layer.fuse_input_allreduce, layer.ffn_all_reduce_deferred = True, True
    family = MiniMaxFfnKernels(backbone, DEPLOY, 1, 2)  # rank 1 of 2
    monkeypatch.setattr(family, "check", list)
    table = family.build(NS(group=None, device="cpu"), [1])
    kernel = table[1][1]
    kernel.slots = lambda: torch.zeros(1, dtype=torch.int64)
    out, _ = kernel(None, torch.ones(1, 4), torch.zeros(1, 4))
    assert calls == (["fused"] if tree == "nvidia" else ["plain"])
    assert torch.equal(out, torch.zeros(1, 4) if tree == "nvidia" else torch.full((1, 4), 3.0))
    assert family.notes == []  # vLLM's experts read in place: no copy


def kimi_backbone(conv_dtype=torch.bfloat16, in_proj_rows=None, tree="nvidia", **kda_changes):
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
    return from_tree("kimi_k3", tree, config=text, start_layer=0,
                     end_layer=cfg.num_hidden_layers, layers=layers)  # fmt: skip


@pytest.mark.parametrize("tree", TREES)
def test_kimi_takes_the_kda_layers(tree):
    family = KimiKdaKernels(kimi_backbone(tree=tree), DEPLOY, 0, 1)
    assert family.layers == (0, 1, 2, 4, 5, 6)  # 1-based kda_layers skip every 4th
    assert family.metadata_key == "model.layers.0.self_attn"
    assert family.check() == [] and family.kv_check() == []
    assert family.kv_key() == family.backbone.layers[0].self_attn.kv_cache[1].data_ptr()


@pytest.mark.parametrize("tree", TREES)
def test_kimi_refusals(tree):
    family = KimiKdaKernels(kimi_backbone(tree=tree, use_full_rank_gate=False), DEPLOY, 0, 3)
    assert family.check() == ["KDA without the full-rank gate", "KDA heads not split over TP 3"]
    family = KimiKdaKernels(kimi_backbone(in_proj_rows=100, tree=tree), DEPLOY, 0, 1)
    (reason,) = family.check()
    assert reason.startswith("loaded weights: in_proj has 100 rows, K1 expects"), reason
    family = KimiKdaKernels(kimi_backbone(conv_dtype=torch.float16, tree=tree), DEPLOY, 0, 1)
    assert family.kv_check() == ["KDA conv state dtype torch.float16: needs bf16"]


@pytest.mark.parametrize("block_write", [True, False])
def test_kimi_amd_layer_passes_the_prefix_as_vllms_amd_tree(block_write, monkeypatch):
    """vLLM's AMD KimiDecoderLayer: (positions, prefix, blocks, delta) -> (prefix, blocks,
    MLP output); a block-write layer's attention output starts the MLP's prefix."""
    import vllm.models.kimi_k3.amd.linear as amd

    seen = {}

    def apply_attn_res(prefix, blocks, proj, norm, valid, *, delta, output_norm, quant_key):
        seen.update(prefix=prefix, delta=delta, valid=valid, norm=output_norm, quant=quant_key)
        return prefix * 10

    monkeypatch.setattr(amd, "_apply_attn_res", apply_attn_res)
    layer = NS(
        is_block_write_layer=block_write, prev_valid_blocks=2, mlp_res_proj="proj",
        mlp_res_norm="norm", post_attention_layernorm="post", mlp=lambda x: x + 1,
    )  # fmt: skip
    kda = AmdKdaLayer(layer, k1=None, requests=1, weights={})
    attn_out = torch.full((1, 4), 5.0)
    inputs = []
    monkeypatch.setattr(kda, "attention", lambda *a: inputs.append(a) or attn_out)
    prefix_in, blocks, delta_in = torch.ones(1, 4), torch.zeros(1, 3, 4), torch.full((1, 4), 2.0)
    prefix, blocks_out, mlp_out = kda(None, prefix_in, blocks, delta_in)
    assert inputs == [(prefix_in, delta_in, blocks)] and blocks_out is blocks
    assert seen["prefix"] is (attn_out if block_write else prefix_in) and prefix is seen["prefix"]
    assert seen["delta"] is (None if block_write else attn_out)
    assert seen["valid"] == 2 + block_write and seen["norm"] == "post" and seen["quant"] is None
    assert torch.equal(mlp_out, seen["prefix"] * 10 + 1)
