"""K2's plain-torch reference: its sizes against vLLM's and the AMD kernel's, its TP split
against the same layer at TP 1 (shards cut from one set of whole weights), fp32 against
fp64 accumulation, padding rows and the block-write reset."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2.inputs import step_inputs
from mono_kernels_kimi.k2.reference import k2_reference
from mono_kernels_kimi.k2.weights import K2Weights, random_weights

pytestmark = pytest.mark.timeout(120)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def test_real_per_rank_sizes_match_the_amd_kernel():
    # vllm/models/kimi_k3/amd/specialized_decode/mono/stages/moe.py and attention/back.py
    cfg = KimiK3Config()
    assert cfg.o_proj_in == 1536
    assert (cfg.latent_size, cfg.num_experts, cfg.num_experts_per_token) == (3584, 896, 16)
    assert (cfg.routed_intermediate, cfg.shared_intermediate) == (384, 768)
    assert (cfg.experts_per_rank, cfg.latent_per_rank, cfg.hidden_per_rank) == (112, 448, 896)


def test_field_names_are_vllms():
    configs = pytest.importorskip("vllm.transformers_utils.configs.kimi_linear")
    params = inspect.signature(configs.KimiLinearConfig.__init__).parameters
    for name in (
        "routed_expert_hidden_size",
        "num_experts",
        "num_experts_per_token",
        "moe_intermediate_size",
        "num_shared_experts",
        "routed_scaling_factor",
        "moe_renormalize",
        "latent_moe_use_norm",
        "activation_situ_beta",
        "activation_situ_linear_beta",
    ):
        assert name in params, name


def test_mlp_attn_res_sources_follow_post_attn_norm():
    cfg = KimiK3Config()  # block size 12
    assert cfg.mlp_attn_res(0) == (1, True)
    assert cfg.mlp_attn_res(5) == (1, False)
    assert cfg.mlp_attn_res(12) == (2, True)
    assert cfg.mlp_attn_res(13) == (2, False)


def _shard(whole: K2Weights, cfg: KimiK3Config, rank: int) -> K2Weights:
    """Rank `rank`'s weights at `cfg.tp` cut from TP-1 weights, as vLLM's loaders cut them."""
    tp, ko = cfg.tp, cfg.o_proj_in
    ri, si = cfg.routed_intermediate, cfg.shared_intermediate

    def halves(t, n):  # [.., 2N, K] gate|up -> this rank's gate rows then up rows
        g, u = t[..., : n * tp, :], t[..., n * tp :, :]
        return torch.cat(
            (g[..., rank * n : (rank + 1) * n, :], u[..., rank * n : (rank + 1) * n, :]), -2
        )

    def cols(t, n):
        return t[..., rank * n : (rank + 1) * n].contiguous()

    return replace(
        whole,
        o_proj=cols(whole.o_proj, ko),
        shared_w13=halves(whole.shared_w13, si).contiguous(),
        shared_w2=cols(whole.shared_w2, si),
        w13=halves(whole.w13, ri).contiguous(),
        w13_scale=halves(whole.w13_scale, ri).contiguous(),
        w2=cols(whole.w2, ri // 2),
        w2_scale=cols(whole.w2_scale, ri // 32),
    )


@pytest.mark.parametrize("layer_idx", [2, 3])  # a block-write layer and a plain one
def test_tp_split_matches_tp1(layer_idx):
    cfg = KimiK3Config.tiny(2)
    one = cfg.with_tp(1)
    whole = random_weights(one, seed=1)
    step = step_inputs(cfg, 3, seed=2)
    shards = [_shard(whole, cfg, r) for r in range(cfg.tp)]
    for w in shards:
        w.validate(cfg)
    core = torch.cat(step.cores, -1)  # TP 1 sees the ranks' cores side by side
    a = k2_reference(one, [core], step.prefix, step.blocks, [whole], layer_idx)
    b = k2_reference(cfg, step.cores, step.prefix, step.blocks, shards, layer_idx)
    assert torch.equal(a.topk_ids, b.topk_ids)
    assert rel(b.out, a.out) < 1e-2
    assert rel(b.prefix, a.prefix) < 1e-2


def test_fp32_accumulation_is_near_fp64():
    cfg = KimiK3Config.tiny(2)
    ws = [random_weights(cfg, seed=3, rank=r) for r in range(cfg.tp)]
    step = step_inputs(cfg, 4, seed=4)
    a = k2_reference(cfg, step.cores, step.prefix, step.blocks, ws, 3)
    b = k2_reference(cfg, step.cores, step.prefix, step.blocks, ws, 3, acc=torch.float64)
    assert torch.equal(a.topk_ids, b.topk_ids)
    assert rel(a.out, b.out) < 1e-2
    assert a.out.abs().max() > 0.1  # the layer produces O(1) output


def test_padding_rows_write_nothing_and_reset_restarts_the_prefix():
    cfg = KimiK3Config.tiny(1)
    ws = [random_weights(cfg, seed=5)]
    step = step_inputs(cfg, 3, seed=6, padding=(1,))
    res = k2_reference(cfg, step.cores, step.prefix, step.blocks, ws, 2, step.live)
    assert (res.out[1] == 0).all() and (res.topk_ids[1] == -1).all()
    assert torch.equal(res.prefix[1], step.prefix[1])
    o = (step.cores[0].float() @ ws[0].o_proj.float().t()).to(torch.bfloat16)
    assert torch.equal(res.prefix[0], o[0])  # layer 2 writes a block: prefix = o
    plain = k2_reference(cfg, step.cores, step.prefix, step.blocks, ws, 3, step.live)
    assert torch.equal(plain.prefix[0], (step.prefix[0].float() + o[0].float()).to(torch.bfloat16))


def test_weights_refuse_wrong_shapes_and_pack_round_trips():
    cfg = KimiK3Config.tiny(2)
    w = random_weights(cfg, seed=7)
    w.validate(cfg)
    with pytest.raises(ValueError, match="weights.o_proj: shape"):
        replace(w, o_proj=w.o_proj[:, :-1].contiguous()).validate(cfg)
    with pytest.raises(ValueError, match="weights.router: dtype"):
        replace(w, router=w.router.float()).validate(cfg)
    with pytest.raises(ValueError, match="weights.o_proj"):
        w.validate(cfg.with_tp(1))  # the same model at another TP
    dense = w.dense("w13").clone()
    rot = w.packed(True)
    assert rot.rot and torch.equal(rot.dense("w13"), dense)
    with pytest.raises(ValueError, match="already packed"):
        rot.packed(False)
