"""MiniMax-M3: every sparse MoE decoder layer takes the FFN kernel.

The kernel (`mono_kernels_minimax.ffn`) starts from the layer's unreduced o_proj output
and ends with the all-reduced MoE output: the attention all-reduce + residual + Gemma
norm seam, the fp32 router and top-k, the shared and routed experts, the MoE all-reduce.
So a replaced layer runs vLLM's own input norm and attention, then the kernel. Around the
kernels the hand-offs follow the vLLM tree the layers come from (`mono_vllm.variants`):

- NVIDIA: vLLM leaves each MoE all-reduce to the next layer's input norm (or the final
  norm). A layer after a kernel layer takes an already-reduced input: plain (add + Gemma)
  norm; the last kernel layer before a layer or final norm that all-reduces its input
  hands over the sum on rank 0 and zeros elsewhere, which that all-reduce sums back.
- AMD: vLLM's MoE all-reduces its own output and every input norm is plain, as the
  kernel's output is: nothing changes around a kernel layer.

Experts: the kernel reads MXFP4 experts as the checkpoint stores them (``mxfp4-k32``).
When vLLM's MoE backend keeps them so (EMULATION), the kernel streams vLLM's tensors in
place. When it rewrites them for its own kernels (HUMMING, vLLM's default on Hopper;
AITER on ROCm), vLLM's MoE still needs its layout for every step the kernels do not take,
so the kernel gets a copy of its own, unpacked from vLLM's (`mono_runtime.stream.sources`)
and packed into the kernel's layout: one more copy of the routed experts, logged at startup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..deployment import Deployment, KernelSupport
from ..experts import (
    copy_reason,
    expert_bytes,
    mxfp4_layout,
    unpacked_experts,
    weight_and_scale,
)
from ..variants import AMD, NVIDIA, variant


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


def routed_experts(layer: Any) -> Any:
    """vLLM's ``RoutedExperts`` of a sparse layer: the module holding the expert tensors
    and the MoE quant method (behind the layer's ``MoERunner``)."""
    return layer.block_sparse_moe.experts.routed_experts


def expert_source(experts: Any) -> tuple[Any, Any]:
    """(`WeightFormat`, `ExpertLayout` or None) of the experts vLLM's MoE layer holds
    (`experts`: its ``RoutedExperts``); ValueError for a layout mono does not read."""
    from mono_kernels_minimax.formats import WeightFormat

    layout = mxfp4_layout(experts)
    if layout is not None:
        return WeightFormat.MXFP4, layout
    if getattr(experts.w13_weight, "is_shuffled", False):
        raise ValueError("experts shuffled for AITER's MoE kernels (mono reads them as loaded)")
    dtype = experts.w13_weight.dtype
    if dtype == torch.bfloat16:
        return WeightFormat.BF16, None
    if dtype == torch.float8_e4m3fn:
        return WeightFormat.FP8, None
    raise ValueError(f"expert weights of dtype {dtype}")


def ffn_experts(experts: Any, layout: Any, cfg: Any, tp: int, device: Any = None) -> dict:
    """The FFN's own mxfp4-k32 copy of a layer's experts (`unpacked_experts` at its sizes)."""
    return unpacked_experts(experts, layout, cfg.hidden_size, cfg.per_rank_intermediate(tp), device)


def ffn_weights(layer: Any, experts: dict | None = None) -> Any:
    """One loaded sparse layer's FFN weights (`FfnWeights`): zero-copy views of vLLM's
    tensors, with `experts` (w13, w2 and their scales) in place of vLLM's when given."""
    from mono_kernels_minimax.ffn.weights import FfnWeights

    moe = layer.block_sparse_moe
    routed = routed_experts(layer)
    w13, w13_scale = weight_and_scale(routed, "w13_")
    w2, w2_scale = weight_and_scale(routed, "w2_")
    sw13, sw13_scale = weight_and_scale(moe.shared_experts.gate_up_proj, "")
    sw2, sw2_scale = weight_and_scale(moe.shared_experts.down_proj, "")
    bundle = {"w13": w13, "w13_scale": w13_scale, "w2": w2, "w2_scale": w2_scale}
    bundle.update(experts or {})
    return FfnWeights(
        fmt=expert_source(routed)[0],
        norm=layer.post_attention_layernorm.weight.data,
        router=moe.gate.weight.data,
        bias=moe.e_score_correction_bias.data,
        shared_w13=sw13,
        shared_w13_scale=sw13_scale,
        shared_w2=sw2,
        shared_w2_scale=sw2_scale,
        **bundle,
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
        self.variant = variant(backbone)
        stage = range(backbone.start_layer, backbone.end_layer)
        self.layers = tuple(i for i in stage if getattr(backbone.layers[i], "is_moe_layer", False))
        self.metadata_key = attention_key(backbone.layers[self.layers[0]]) if self.layers else ""
        self.notes: list[str] = []
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
        first = self.backbone.layers[self.layers[0]]
        if self.variant == AMD and first.block_sparse_moe.is_fused_shared_expert_enabled:
            reasons.append(
                "the shared expert fused into the routed experts "
                "(VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1)"
            )
            return reasons
        try:
            cfg = kernel_config(text)
            fmt, layout = self._source()
            FfnBuild(cfg, rows=1, tp=self.world, weights=fmt)
            device = first.post_attention_layernorm.weight.device
            copy = 0
            for i in self.layers:
                layer = self.backbone.layers[i]
                if self._copies(layout):  # what build will unpack, as shapes only
                    experts = ffn_experts(routed_experts(layer), layout, cfg, self.world, "meta")
                    w = ffn_weights(layer, experts)
                    w.validate(cfg, self.world)
                    copy += expert_bytes(w)
                else:
                    ffn_weights(layer).validate(cfg, self.world, device)
        except ValueError as err:
            reasons.append(f"loaded weights: {err}")
            return reasons
        too_big = copy_reason(copy, device, "the FFN kernel")
        return reasons if too_big is None else [*reasons, too_big]

    def _source(self) -> tuple[Any, Any]:
        return expert_source(routed_experts(self.backbone.layers[self.layers[0]]))

    def _copies(self, layout: Any) -> bool:
        """Whether the kernel needs experts of its own: vLLM keeps them in another layout
        than the checkpoint's, or padded."""
        from mono_runtime.stream.sources import ExpertLayout

        if layout is None:
            return False
        if layout is not ExpertLayout.K32:
            return True
        cfg = kernel_config(self.backbone.config)
        h, i = cfg.hidden_size, cfg.per_rank_intermediate(self.world)
        experts = routed_experts(self.backbone.layers[self.layers[0]])
        return (tuple(experts.w13_weight.shape[1:]), tuple(experts.w2_weight.shape[1:])) != (
            (2 * i, h // 2),
            (h, i // 2),
        )

    def runner_bytes(self, widths) -> tuple[int, int]:
        from mono_kernels_minimax.ffn.spec import FfnBuild, peer_bytes, scratch_bytes
        from mono_kernels_minimax.formats import WeightFormat

        cfg, fmt = kernel_config(self.backbone.config), self._source()[0]
        # the runner picks its build when it is made (Gluon where it packs its own copy of
        # MXFP4 or FP8 experts, whose tiles need more scratch): room for either plan
        plans = (False, True) if fmt in (WeightFormat.MXFP4, WeightFormat.FP8) else (False,)
        scratch = sum(
            max(scratch_bytes(FfnBuild(cfg, s, self.world, fmt, frag=f)) for f in plans)
            for s in widths
        )
        return scratch, peer_bytes(cfg, self.world)

    def build(self, runner: Any, widths) -> dict[int, dict[int, FfnLayer]]:
        from mono_kernels_minimax.ffn.runner import FfnRunner

        cfg, layers = kernel_config(self.backbone.config), self.backbone.layers
        fmt, layout = self._source()
        copies = self._copies(layout)
        # sharing vLLM's tensors, the kernel streams them as they are (vLLM's MoE reads
        # them too); its own copy it packs into its fastest layout
        ffn = self._ffn = FfnRunner(
            cfg, fmt, runner.group, self.rank, self.world, runner.device,
            widths=widths, runner=runner, pack=copies,
        )  # fmt: skip
        ffn.warm()  # compiles every width and refuses one that cannot be resident
        weights = {}
        for i in self.layers:
            experts = None
            if copies:
                experts = ffn_experts(routed_experts(layers[i]), layout, cfg, self.world)
            weights[i] = ffn.pack(ffn_weights(layers[i], experts))
        if copies:
            size = sum(expert_bytes(weights[i]) for i in self.layers)
            self.notes.append(
                f"routed experts copied from vLLM's {layout.value} layout into the kernel's "
                f"({size / 2**30:.1f} GiB per rank; vLLM's MoE keeps its own for other steps)"
            )
        mine, last = set(self.layers), self.layers[-1]

        def launch(i: int) -> Ffn:
            return lambda part, residual, slots: ffn(
                part, residual, weights[i], slots, final=i == last
            )

        # the next consumer (a stock layer or the final norm) all-reduces a deferred output
        nvidia = self.variant == NVIDIA
        hand_off = {i: nvidia and i + 1 not in mine and layers[i].ffn_all_reduce_deferred
                    for i in mine}  # fmt: skip
        fronts = {i: vllm_front(layers[i], reduced=i - 1 in mine or not nvidia) for i in mine}
        return {
            w: {
                i: FfnLayer(
                    fronts[i],
                    launch(i),
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
        if self._ffn is not None:
            self._ffn.close()  # the shared MonoRunner stays open: the executor closes it
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


def vllm_front(layer: Any, reduced: bool) -> Front:
    """vLLM's input norm and attention of a `MiniMaxM3DecoderLayer`, up to the unreduced
    o_proj output. `reduced`: the layer's input is already all-reduced (after a kernel
    layer, or always in vLLM's AMD tree), so a plain add + Gemma norm replaces vLLM's fused
    all-reduce + norm where the layer has one."""
    from vllm.model_executor.layers.fused_allreduce_gemma_rms_norm import (
        fused_allreduce_gemma_rms_norm,
    )

    def front(positions, hidden_states, residual):
        if reduced or not layer.fuse_input_allreduce:
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
