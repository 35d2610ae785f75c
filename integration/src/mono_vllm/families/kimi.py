"""Kimi-K3: every KDA decoder layer takes K1.

K1 (`mono_kernels_kimi.kda`) runs a KDA layer from its AttnRes inputs to the gated-norm
output that o_proj reads: AttnRes (with the block write), input RMSNorm, in_proj, f_b
gate, short conv update, l2norm, the delta-rule recurrence into the step's state slots,
gated RMSNorm. It reads vLLM's loaded weights and KDA states in place. The rest of the
layer (o_proj, the MLP AttnRes and the MoE) stays vLLM's: the replaced layer calls the
layer's own ``self_attn.o_proj`` and ``mlp``, and the MLP AttnRes of the vLLM tree it
comes from (`mono_vllm.variants`): ``KimiDecoderLayer._post_attn_norm`` in the NVIDIA
tree, ``_apply_attn_res`` in the AMD one (private to vLLM: called, not changed). The two
trees also pass the AttnRes prefix differently between layers. K1 runs on the rank's
`MonoRunner` (its scratch, tickets, tags, health and alarm words), so a K1 wait that gives
up makes `after_step` raise on every rank (the last KDA layer's launch ends in the TP fault
handshake) and the executor's guard poison the step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..deployment import Deployment, KernelSupport
from ..experts import weight_and_scale
from ..variants import AMD, variant

# KimiLinearConfig fields K2 reads, by the same names (KimiK3Config's)
MOE_FIELDS = (
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
)


def k2_reasons(text: Any, world: int) -> list[str]:
    """Why K2 cannot serve the MoE layers of vLLM's loaded text config at TP `world`
    (empty: it can); the weights are checked per layer when the runner is built."""
    checks = (
        (text.num_experts is None, "a model without MoE layers"),
        (text.routed_expert_hidden_size is None, "a MoE without the latent projection"),
        (not text.latent_moe_use_norm, "a latent MoE without its RMSNorm"),
        (not text.num_shared_experts, "a MoE without shared experts"),
        (text.hidden_act != "situ", f"activation {text.hidden_act} (K2: situ)"),
        (
            text.moe_router_activation_func != "sigmoid",
            f"router {text.moe_router_activation_func} (K2: sigmoid)",
        ),
        (not text.moe_renormalize, "top-k weights without renormalization"),
        (
            text.use_grouped_topk and (text.num_expert_group, text.topk_group) != (1, 1),
            f"grouped top-k over {text.num_expert_group} groups (K2: one group)",
        ),
        (text.attn_res_block_size is None, "a model without AttnRes"),
    )
    reasons = [why for bad, why in checks if bad]
    for name in ("num_experts", "routed_expert_hidden_size", "moe_intermediate_size"):
        size = getattr(text, name, None)
        if size is not None and size % world:
            reasons.append(f"{name} {size} not split over TP {world}")
    return reasons


def k2_weights(layer: Any, experts: dict | None = None) -> Any:
    """One loaded MoE layer's K2 weights (`K2Weights`): zero-copy views of vLLM's tensors,
    with `experts` (the kernel's mxfp4-k32 copy: w13, w2 and their scales) in place of
    vLLM's when given."""
    from mono_kernels_kimi.k2.weights import K2Weights

    moe = layer.mlp
    routed = getattr(moe.experts, "routed_experts", moe.experts)
    w13, w13_scale = weight_and_scale(routed, "w13_")
    w2, w2_scale = weight_and_scale(routed, "w2_")
    bundle = {"w13": w13, "w13_scale": w13_scale, "w2": w2, "w2_scale": w2_scale}
    bundle.update(experts or {})
    return K2Weights(
        o_proj=layer.self_attn.o_proj.weight.data,
        mlp_res_norm=layer.mlp_res_norm.weight.data,
        mlp_res_proj=layer.mlp_res_proj.weight.data.squeeze(0),
        post_norm=layer.post_attention_layernorm.weight.data,
        router=moe.gate.weight.data,
        bias=moe.gate.e_score_correction_bias.data,
        latent_down=moe.routed_expert_down_proj.weight.data,
        latent_norm=moe.routed_expert_norm.weight.data,
        up_proj=moe.routed_expert_up_proj.weight.data,
        shared_w13=moe.shared_experts.gate_up_proj.weight.data,
        shared_w2=moe.shared_experts.down_proj.weight.data,
        **bundle,
    )


def kernel_config(text: Any, world: int, in_proj_rows: int) -> Any:
    """The `KimiK3Config` of vLLM's loaded text config at TP `world`."""
    from mono_kernels_kimi.config import KimiK3Config

    kda = text.linear_attn_config
    moe = {f: getattr(text, f) for f in MOE_FIELDS if getattr(text, f, None) is not None}
    cfg = KimiK3Config(
        hidden_size=text.hidden_size,
        num_hidden_layers=text.num_hidden_layers,
        kda_num_heads=kda["num_heads"],
        kda_head_dim=kda["head_dim"],
        conv_kernel_size=kda["short_conv_kernel_size"],
        gate_lower_bound=kda.get("gate_lower_bound", -5.0),
        rms_norm_eps=text.rms_norm_eps,
        attn_res_block_size=text.attn_res_block_size,
        kda_layers=tuple(kda["kda_layers"]),
        tp=world,
        **moe,
    )
    for alignment in (16, 128):  # bf16 in_proj pads rows to 16, FP8_PB_WO weights to 128
        padded = cfg.in_proj_rows_unpadded + (-cfg.in_proj_rows_unpadded % alignment)
        if padded == in_proj_rows:
            return replace(cfg, in_proj_alignment=alignment)
    raise ValueError(f"in_proj has {in_proj_rows} rows, K1 expects {cfg.in_proj_rows}")


def k1_weights(layer: Any) -> dict[str, torch.Tensor]:
    """Zero-copy views of one loaded KDA layer's K1 weights, by K1's argument names."""
    attn = layer.self_attn
    return {
        "ares_norm": layer.self_attention_res_norm.weight.data,
        "ares_qk": layer.self_attention_res_proj.weight.data.squeeze(0),
        "in_norm": layer.input_layernorm.weight.data,
        "in_proj": attn.in_proj_qkvgfab.weight.data,
        "f_b": attn.f_b_proj.weight.data,
        "conv": attn.conv1d.weight.data.squeeze(1),
        "a_log": attn.A_log.data,
        "dt_bias": attn.dt_bias.data,
        "o_norm": attn.o_norm.weight.data,
    }


class KdaLayer:
    """One KDA decoder layer on K1 at one width (what `Step.layer(i)` returns): K1 from
    the AttnRes inputs to o_proj's input, then vLLM's o_proj, MLP AttnRes and MLP, in the
    calling convention of vLLM's NVIDIA tree: ``(positions, hidden_states=delta,
    residual=blocks, prefix_sum=prefix) -> (MLP output, prefix, blocks)``."""

    def __init__(
        self, layer: Any, k1: Any, requests: int, weights: dict, final: bool = False
    ) -> None:
        self.layer, self.k1, self.requests, self.weights = layer, k1, requests, weights
        self.final = final  # the step's last KDA layer: its launch ends in the handshake

    def attention(self, prefix, delta, blocks) -> torch.Tensor:
        """K1 (which adds `delta` into `prefix` and writes the layer's block), then vLLM's
        o_proj: the attention output."""
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        layer, attn = self.layer, self.layer.self_attn
        md = get_forward_context().attn_metadata[attn.prefix]
        conv_state, state = attn.kv_cache[:2]
        if not is_conv_state_dim_first():
            conv_state = conv_state.transpose(-1, -2)
        spec = self.k1.spec
        core = torch.empty(
            prefix.shape[0], attn.local_projection_size, dtype=prefix.dtype, device=prefix.device
        )
        self.k1(
            self.requests,
            final=self.final,
            prefix=prefix,
            delta=delta,
            blocks=blocks,
            num_blocks=layer.prev_valid_blocks,
            write_idx=layer.block_write_idx if layer.is_block_write_layer else -1,
            weights=self.weights,
            conv_state=conv_state,
            state=state,
            state_indices=md.spec_state_indices_tensor
            if spec
            else md.non_spec_state_indices_tensor,
            num_accepted=md.num_accepted_tokens if spec else None,
            out=core,
        )
        return attn.o_proj(core)[0]

    def __call__(self, positions, hidden_states, residual, prefix_sum=None, **kwargs):
        layer = self.layer
        hidden = self.attention(prefix_sum, hidden_states, residual)
        hidden, prefix_sum, residual = layer._post_attn_norm(hidden, residual, prefix_sum)
        return layer.mlp(hidden), prefix_sum, residual


class AmdKdaLayer(KdaLayer):
    """The same in the calling convention of vLLM's AMD tree: ``(positions, prefix,
    blocks, prefix_delta) -> (prefix, blocks, MLP output)``; the MLP's AttnRes is that
    tree's ``_apply_attn_res`` (a private function of vllm/models/kimi_k3/amd/linear.py:
    called, not changed), with the arguments its ``KimiDecoderLayer`` passes."""

    def __call__(self, positions, hidden_states, residual, prefix_delta=None, **kwargs):
        from vllm.models.kimi_k3.amd.linear import KimiMLP, _apply_attn_res

        layer = self.layer
        attn = self.attention(hidden_states, prefix_delta, residual)
        # a block-write layer starts a new prefix with its attention output
        prefix, delta = (attn, None) if layer.is_block_write_layer else (hidden_states, attn)
        quant_key = layer.mlp.get_input_quant_key() if isinstance(layer.mlp, KimiMLP) else None
        hidden = _apply_attn_res(
            prefix,
            residual,
            layer.mlp_res_proj,
            layer.mlp_res_norm,
            layer.prev_valid_blocks + int(layer.is_block_write_layer),
            delta=delta,
            output_norm=layer.post_attention_layernorm,
            quant_key=quant_key,
        )
        return prefix, residual, layer.mlp(hidden)


class KimiKdaKernels:
    """K1 on every KDA layer of one rank (a `LayerKernels`)."""

    name = "Kimi-K3 KDA (K1)"
    support = KernelSupport(tp=(1, 2, 4, 8, 16), max_rows=8)
    dtypes: dict[str, str] = {}

    def __init__(self, backbone: Any, deployment: Deployment, rank: int, world: int) -> None:
        self.backbone, self.deployment, self.rank, self.world = backbone, deployment, rank, world
        self.variant = variant(backbone)
        self.notes: list[str] = []
        text = backbone.config
        stage = range(backbone.start_layer, backbone.end_layer)
        self.layers = tuple(i for i in stage if text.is_kda_layer(i))
        self.metadata_key = backbone.layers[self.layers[0]].self_attn.prefix if self.layers else ""
        self._k1: Any = None

    def check(self) -> list[str]:
        text = self.backbone.config
        kda = text.linear_attn_config or {}
        checks = (
            (not self.layers, "no KDA layers on this rank"),
            (text.attn_res_block_size is None, "a model without AttnRes"),
            (not kda.get("use_full_rank_gate", False), "KDA without the full-rank gate"),
            (kda.get("short_conv_kernel_size") != 4, "a short conv other than 4 wide"),
            (kda.get("num_heads", 0) % self.world, f"KDA heads not split over TP {self.world}"),
        )
        reasons = [why for bad, why in checks if bad]
        if reasons:
            return reasons
        try:
            self._config()
        except ValueError as err:
            reasons.append(f"loaded weights: {err}")
        return reasons

    def _config(self) -> Any:
        first = self.backbone.layers[self.layers[0]].self_attn
        return kernel_config(
            self.backbone.config, self.world, first.in_proj_qkvgfab.weight.shape[0]
        )

    def runner_bytes(self, widths) -> tuple[int, int]:
        from mono_kernels_kimi.kda.runner import runner_bytes

        q = self.deployment.q
        device = self.backbone.layers[self.layers[0]].input_layernorm.weight.device
        return runner_bytes(self._config(), device, q, self.world, spec=q > 1, max_rows=max(widths))

    def build(self, runner: Any, widths) -> dict[int, dict[int, KdaLayer]]:
        from mono_kernels_kimi.kda.runner import KdaRunner

        q, layers = self.deployment.q, self.backbone.layers
        device = layers[self.layers[0]].input_layernorm.weight.device
        self._k1 = KdaRunner(
            self._config(), device, q, spec=q > 1, max_rows=max(widths), runner=runner
        )
        self._k1.warm()  # compiles and loads every width: before profiling and capture
        weights = {i: k1_weights(layers[i]) for i in self.layers}
        kind = AmdKdaLayer if self.variant == AMD else KdaLayer
        return {
            w: {
                i: kind(layers[i], self._k1, w // q, weights[i], i == self.layers[-1])
                for i in self.layers
            }
            for w in widths
        }

    def step_begin(self, runner: Any) -> None:
        self._k1.step_begin()  # bumps the runner's epoch once; K1's tag slots from 0

    def close(self) -> None:
        self._k1 = None

    def _states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        state = self.backbone.layers[self.layers[0]].self_attn.kv_cache
        if not isinstance(state, (list, tuple)) or len(state) < 2 or not state[1].numel():
            return None
        return state[0], state[1]

    def kv_key(self) -> int | None:
        states = self._states()
        return None if states is None else states[1].data_ptr()

    def kv_check(self) -> list[str]:
        conv, recurrent = self._states()
        checks = (
            (conv.dtype != torch.bfloat16, f"KDA conv state dtype {conv.dtype}: needs bf16"),
            (
                recurrent.dtype != torch.float32,
                f"KDA recurrent state dtype {recurrent.dtype}: needs fp32",
            ),
        )
        return [why for bad, why in checks if bad]
