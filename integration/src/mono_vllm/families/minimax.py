"""MiniMax-M3: every sparse MoE decoder layer takes the FFN kernel.

The kernel (`mono_kernels_minimax.ffn`) starts from the layer's unreduced o_proj output
and ends with the all-reduced MoE output: the attention all-reduce + residual + Gemma
norm seam, the fp32 router and top-k, the shared and routed experts, the MoE all-reduce.
So a replaced layer runs vLLM's own input norm and attention, then the kernel. vLLM's
layers leave the MoE all-reduce to the next layer's input norm (or the final norm); around
the kernels the hand-offs change accordingly:

- a layer after a kernel layer takes an already-reduced input: plain (add + Gemma) norm;
- the last kernel layer before a layer or final norm that all-reduces its input hands
  over the sum on rank 0 and zeros elsewhere, which that all-reduce sums back exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..deployment import Deployment, KernelSupport


def kernel_config(text: Any) -> Any:
    """The `MiniMaxM3Config` of vLLM's loaded text config (``hf_text_config``)."""
    from mono_kernels_minimax.config import MiniMaxM3Config

    freq = list(text.moe_layer_freq)
    return MiniMaxM3Config(
        hidden_size=text.hidden_size,
        num_hidden_layers=text.num_hidden_layers,
        first_dense_layers=freq.index(1) if 1 in freq else len(freq),
        num_experts=text.num_local_experts,
        top_k=text.num_experts_per_tok,
        moe_intermediate_size=text.intermediate_size,
        n_shared_experts=text.n_shared_experts or 0,
        dense_intermediate_size=text.dense_intermediate_size,
        routed_scaling_factor=text.routed_scaling_factor,
        swiglu_alpha=text.swiglu_alpha,
        swiglu_beta=text.swiglu_beta,
        swiglu_limit=text.swiglu_limit,
        rms_norm_eps=text.rms_norm_eps,
    )


def model_reasons(text: Any) -> list[str]:
    """Config choices of vLLM's MiniMax-M3 layers that the kernel does not compute."""
    checks = (
        (text.hidden_act != "swigluoai", f"activation {text.hidden_act} (kernel: swigluoai)"),
        (text.scoring_func != "sigmoid", f"router {text.scoring_func} (kernel: sigmoid)"),
        (not text.use_routing_bias, "a router without the score-correction bias"),
        (not text.n_shared_experts, "no shared expert"),
    )
    return [why for bad, why in checks if bad]


def expert_format(experts: Any) -> Any:
    """The `WeightFormat` vLLM's MoE layer holds its experts in, from the loaded tensors."""
    from mono_kernels_minimax.formats import WeightFormat

    dtype = experts.w13_weight.dtype
    if dtype == torch.bfloat16:
        return WeightFormat.BF16
    if dtype == torch.uint8:
        return WeightFormat.MXFP4
    if dtype == torch.float8_e4m3fn:
        return WeightFormat.FP8
    raise ValueError(f"expert weights of dtype {dtype}")


def _weight_and_scale(module: Any, prefix: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = getattr(module, f"{prefix}weight")
    scale = getattr(module, f"{prefix}weight_scale", None)
    if scale is None:
        scale = getattr(module, f"{prefix}weight_scale_inv", None)
    return weight.data, None if scale is None else scale.data


def ffn_weights(layer: Any) -> Any:
    """Zero-copy views of one loaded sparse layer's FFN weights (`FfnWeights`)."""
    from mono_kernels_minimax.ffn.weights import FfnWeights

    moe = layer.block_sparse_moe
    w13, w13_scale = _weight_and_scale(moe.experts, "w13_")
    w2, w2_scale = _weight_and_scale(moe.experts, "w2_")
    sw13, sw13_scale = _weight_and_scale(moe.shared_experts.gate_up_proj, "")
    sw2, sw2_scale = _weight_and_scale(moe.shared_experts.down_proj, "")
    return FfnWeights(
        fmt=expert_format(moe.experts),
        norm=layer.post_attention_layernorm.weight.data,
        router=moe.gate.weight.data,
        bias=moe.e_score_correction_bias.data,
        w13=w13,
        w13_scale=w13_scale,
        w2=w2,
        w2_scale=w2_scale,
        shared_w13=sw13,
        shared_w13_scale=sw13_scale,
        shared_w2=sw2,
        shared_w2_scale=sw2_scale,
    )


def attention_key(layer: Any) -> str:
    """The attention-metadata key of a decoder layer (sparse layers are their own backend
    layer, dense ones hold an ``Attention``)."""
    attn = layer.self_attn
    return getattr(attn, "layer_name", None) or attn.attn.layer_name


def kv_tensor(layer: Any) -> torch.Tensor | None:
    """The first KV cache tensor vLLM bound to a layer's attention, None while unbound."""
    attn = layer.self_attn
    kv = getattr(attn, "kv_cache", None)
    if kv is None and hasattr(attn, "attn"):
        kv = attn.attn.kv_cache
    while isinstance(kv, (list, tuple)) and kv:
        kv = kv[0]
    return kv if isinstance(kv, torch.Tensor) and kv.numel() else None


class MiniMaxFfnKernels:
    """The FFN kernels of every sparse MoE layer of one rank (a `LayerKernels`)."""

    name = "MiniMax-M3 FFN"
    support = KernelSupport(tp=(1, 2, 4, 8), max_rows=16)
    dtypes: dict[str, str] = {}  # the kernel reads no step tensor but the layer's own

    def __init__(self, backbone: Any, deployment: Deployment, rank: int, world: int) -> None:
        self.backbone, self.deployment, self.rank, self.world = backbone, deployment, rank, world
        stage = range(backbone.start_layer, backbone.end_layer)
        self.layers = tuple(i for i in stage if getattr(backbone.layers[i], "is_moe_layer", False))
        self.metadata_key = attention_key(backbone.layers[self.layers[0]]) if self.layers else ""
        self._ffn: Any = None

    def check(self) -> list[str]:
        from mono_kernels_minimax.ffn.spec import FfnBuild

        text = self.backbone.config
        reasons = model_reasons(text)
        if not self.layers:
            return [*reasons, "no sparse MoE layers on this rank"]
        if self.layers[0] == 0:
            reasons.append("a sparse MoE first layer (the kernel needs a residual)")
        if getattr(self.backbone, "aux_hidden_state_layers", ()):
            # vLLM taps hidden + residual after chosen layers; around the kernel layers
            # the hand-offs differ from vLLM's deferred all-reduce
            reasons.append("EAGLE-3 auxiliary hidden states")
        try:
            cfg = kernel_config(text)
            first = self.backbone.layers[self.layers[0]]
            fmt = expert_format(first.block_sparse_moe.experts)
            FfnBuild(cfg, rows=1, tp=self.world, weights=fmt)
            device = first.post_attention_layernorm.weight.device
            for i in self.layers:
                ffn_weights(self.backbone.layers[i]).validate(cfg, self.world, device)
        except ValueError as err:
            reasons.append(f"loaded weights: {err}")
        return reasons

    def _format(self) -> Any:
        return expert_format(self.backbone.layers[self.layers[0]].block_sparse_moe.experts)

    def runner_bytes(self, widths) -> tuple[int, int]:
        from mono_kernels_minimax.ffn.spec import FfnBuild, peer_bytes, scratch_bytes

        cfg, fmt = kernel_config(self.backbone.config), self._format()
        scratch = sum(scratch_bytes(FfnBuild(cfg, s, self.world, fmt)) for s in widths)
        return scratch, peer_bytes(cfg, self.world)

    def build(self, runner: Any, widths) -> dict[int, dict[int, FfnLayer]]:
        from mono_kernels_minimax.ffn.runner import FfnRunner

        cfg, layers = kernel_config(self.backbone.config), self.backbone.layers
        ffn = self._ffn = FfnRunner(
            cfg,
            self._format(),
            runner.group,
            self.rank,
            self.world,
            runner.device,
            widths=widths,
            runner=runner,
            pack=False,
        )  # fmt: skip  (pack=False: vLLM's own MoE reads the same expert tensors)
        ffn.warm()  # compiles every width and refuses one that cannot be resident
        mine, last = set(self.layers), self.layers[-1]

        def launch(i: int) -> Ffn:
            weights = ffn_weights(layers[i])
            return lambda part, residual, slots: ffn(
                part, residual, weights, slots, final=i == last
            )

        launches = {i: launch(i) for i in self.layers}
        fronts = {i: vllm_front(layers[i], after_kernel=i - 1 in mine) for i in self.layers}
        # the next consumer (a stock layer or the final norm) all-reduces a deferred output
        hand_off = {i: i + 1 not in mine and layers[i].ffn_all_reduce_deferred for i in mine}
        return {
            w: {
                i: FfnLayer(
                    fronts[i],
                    launches[i],
                    vllm_slots(attention_key(layers[i]), w),
                    hand_off[i],
                    self.rank,
                )  # fmt: skip
                for i in self.layers
            }
            for w in widths
        }

    def step_begin(self, runner: Any) -> None:
        self._ffn.step_begin()  # bumps the shared runner's epoch, restarts the launch slots

    def close(self) -> None:
        self._ffn = None

    def kv_key(self) -> int | None:
        kv = kv_tensor(self.backbone.layers[self.layers[0]])
        return None if kv is None else kv.data_ptr()

    def kv_check(self) -> list[str]:
        return []  # the FFN kernel reads no KV cache


Front = Callable[[Any, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Ffn = Callable[[torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor]]


class FfnLayer:
    """One decoder layer on the FFN kernel at one width (what `Step.layer(i)` returns).

    `front(positions, hidden, residual) -> (o_proj partial, residual)`: the layer up to
    its unreduced o_proj output; `ffn(partial, residual, slots) -> (out, residual)`: the
    kernel launch (`out` all-reduced); `slots()`: this step's per-row KV slots (negative:
    a padding row, which joins no expert). `hand_off`: the next consumer all-reduces its
    input, so only rank 0 hands the sum over (the others zeros, which it adds back)."""

    def __init__(self, front: Front, ffn: Ffn, slots: Callable[[], Any], hand_off: bool, rank: int):
        self.front, self.ffn, self.slots = front, ffn, slots
        self.zero_out = hand_off and rank != 0

    def __call__(self, positions, hidden_states, residual, *args, **kwargs):
        partial, residual = self.front(positions, hidden_states, residual)
        out, residual = self.ffn(partial, residual, self.slots())
        if self.zero_out:
            out = torch.zeros_like(out)
        return out, residual


def vllm_front(layer: Any, after_kernel: bool) -> Front:
    """vLLM's input norm and attention of a `MiniMaxM3DecoderLayer`, up to the unreduced
    o_proj output. After a kernel layer the input is already all-reduced: a plain add +
    Gemma norm replaces vLLM's fused all-reduce + norm."""
    from vllm.model_executor.layers.fused_allreduce_gemma_rms_norm import (
        fused_allreduce_gemma_rms_norm,
    )

    def front(positions, hidden_states, residual):
        if after_kernel or not layer.fuse_input_allreduce:
            x, residual = layer.input_layernorm(hidden_states, residual)
        else:
            x, residual = fused_allreduce_gemma_rms_norm(
                hidden_states, residual, layer.input_layernorm
            )
        return layer.self_attn(positions=positions, hidden_states=x), residual

    return front


def vllm_slots(key: str, rows: int) -> Callable[[], Any]:
    """This step's KV slot of each row of the layer `key` (vLLM's PAD_SLOT_ID, -1, marks
    padding rows), from the forward context: a persistent buffer under FULL graphs."""
    from vllm.forward_context import get_forward_context

    def slots():
        mapping = get_forward_context().slot_mapping
        return mapping[key][:rows]

    return slots
