"""Rank body of test_drafter_plugin.py's end-to-end test, in a child process whose
environment sets TRITON_INTERPRET=1: mono's drafter glue (`mono_vllm.drafter`) over a
stand-in of vLLM's loaded K3DSparkModel holding the tiny drafter's weights and caches.

The three vLLM modules the glue imports are stand-ins here with the functions it calls
(importing vLLM costs a child ~20 s on 2 cores; the parent checks those names exist in
vLLM's modules): its TP group, its forward context and its logger."""

from __future__ import annotations

import logging
import sys
import types
from types import SimpleNamespace as NS

import torch
from mono_kernels_kimi.drafter.config import DrafterConfig
from mono_kernels_kimi.drafter.inputs import step_inputs
from mono_kernels_kimi.drafter.reference import cos_sin_cache, drafter_reference
from mono_kernels_kimi.drafter.weights import random_weights
from mono_vllm.switch import SWITCH


def _w(t):
    return NS(weight=t)


def standin_model(cfg, weights, caches, rope, embed_table):
    """What `mono_vllm.drafter` reads of vLLM's K3DSparkForCausalLM, by vLLM's names."""
    layers = []
    for i, (w, cache) in enumerate(zip(weights.layers, caches, strict=True)):
        attn = NS(
            layer_name=f"model.layers.{61 + i}.self_attn",
            kv_cache=cache,
            kv_cache_dtype=cfg.cache_dtype,
            use_output_gate=False,
            rotary_emb=NS(cos_sin_cache=rope),
            fused_qkv_a_proj=_w(w.fused_qkv_a_proj),
            q_a_layernorm=_w(w.q_a_layernorm),
            kv_a_layernorm=_w(w.kv_a_layernorm),
            q_b_proj=_w(w.q_b_proj),
            kv_b_proj=_w(w.kv_b_proj),
            o_proj=_w(w.o_proj),
            _k_scale=w.k_scale.reshape(1),  # vLLM's scales: one-element tensors
            _q_scale=w.q_scale,
        )
        layers.append(
            NS(
                self_attn=attn,
                mlp=NS(gate_up_proj=_w(w.gate_up_proj), down_proj=_w(w.down_proj)),
                input_layernorm=_w(w.input_layernorm),
                post_attention_layernorm=_w(w.post_attention_layernorm),
            )
        )
    backbone = NS(
        layers=layers,
        final_norm=_w(weights.final_norm),
        embed_input_ids=lambda ids: embed_table[ids],
    )
    return NS(model=backbone)


def vllm_config(cfg):
    hf = NS(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        intermediate_size=cfg.intermediate_size,
        hidden_act=cfg.hidden_act,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=cfg.max_position_embeddings,
    )
    return NS(
        speculative_config=NS(
            draft_model_config=NS(hf_config=hf),
            num_speculative_tokens=cfg.num_speculative_tokens,
        ),
        cache_config=NS(block_size=cfg.block_size),
        additional_config={SWITCH: True},
    )


def context(names, step, rows, groups=1):
    """vLLM's forward context of a uniform draft batch (`groups` > 1: the draft layers in
    several KV cache groups, each with its own slot mapping)."""
    md = NS(
        decode=NS(block_table=step.block_table, seq_lens=step.seq_lens),
        num_prefills=0,
        num_decode_tokens=rows,
    )
    slots = [step.slot_mapping.clone() for _ in range(groups)]
    return NS(
        attn_metadata=dict.fromkeys(names, md),
        slot_mapping={n: slots[i % groups] for i, n in enumerate(names)},
    )


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-20))


# (module, function) of vLLM's that mono_vllm.drafter calls
VLLM_CALLS = (
    ("vllm.distributed", "get_tp_group"),
    ("vllm.forward_context", "get_forward_context"),
    ("vllm.forward_context", "is_forward_context_available"),
    ("vllm.logger", "init_logger"),
)


def _vllm_standins() -> dict[str, types.ModuleType]:
    mods = {name: types.ModuleType(name) for name, _ in VLLM_CALLS}
    for name, mod in mods.items():
        sys.modules.setdefault(name, mod)
    return {name: sys.modules[name] for name in mods}


def run(rank, world, group):
    mods = _vllm_standins()
    from mono_vllm import drafter as glue

    fc = mods["vllm.forward_context"]
    mods["vllm.logger"].init_logger = logging.getLogger
    mods["vllm.distributed"].get_tp_group = lambda: NS(
        rank_in_group=rank, world_size=world, cpu_group=group
    )
    cfg = DrafterConfig.tiny(world)
    weights = [random_weights(cfg, seed=3, rank=r) for r in range(world)]
    step = step_inputs(cfg, random_weights(cfg, seed=3), 3, seed=5, padding=(1,))
    caches = [c.clone() for c in step.caches]
    rows = step.embeds.shape[0]
    model = standin_model(cfg, weights[rank], caches, cos_sin_cache(cfg), step.embeds)
    mono = glue.MonoDrafter.requested(vllm_config(cfg), model)
    out = {"live": mono in glue.LIVE}

    seen = {"ctx": None}
    fc.is_forward_context_available = lambda: seen["ctx"] is not None
    fc.get_forward_context = lambda: seen["ctx"]
    ids = torch.arange(rows)
    glue.prepare_all()
    runner = mono.runner
    out["built"] = runner is not None and runner.cfg == cfg
    out["no_context"] = mono.forward(ids, step.positions, None) is None

    seen["ctx"] = context(mono.layer_names, step, rows)
    hidden = mono.forward(ids, step.positions, None)
    want = drafter_reference(
        cfg, step.embeds, step.positions, step.caches, step.block_table, step.seq_lens,
        step.slot_mapping, weights, live=step.live,
    )  # fmt: skip
    live = step.live.repeat_interleave(cfg.query_len)
    out["hidden"] = rel_l2(hidden[live], want.hidden[live])
    out["padding_zero"] = bool((hidden[~live] == 0).all())
    out["caches"] = max(rel_l2(c, w) for c, w in zip(caches, want.caches, strict=True))
    out["hidden_bits"] = hidden.view(torch.int16).sum().item()

    seen["ctx"] = context(mono.layer_names, step, rows, groups=2)
    out["two_groups"] = mono.forward(ids, step.positions, None) is None
    seen["ctx"] = context(mono.layer_names, step, rows)
    out["int32_positions"] = mono.forward(ids, step.positions.int(), None) is None
    out["fell_back"] = sorted(mono._fell_back)

    glue.prepare_all()  # the same caches: the same runner
    out["kept"] = mono.runner is runner
    for layer, cache in zip(model.model.layers, caches, strict=True):
        layer.self_attn.kv_cache = cache.clone()  # vLLM re-bound the draft caches
    glue.prepare_all()
    out["rebuilt"] = mono.runner is not runner and mono.runner is not None
    glue.after_step_all()
    mono.close()
    out["closed"] = mono.runner is None and runner.closed
    return out
