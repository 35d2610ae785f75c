"""Kimi-K3: every KDA decoder layer takes K1, and K2 after it where the layer is a MoE layer.

K1 (`mono_kernels_kimi.kda`) runs a KDA layer from its AttnRes inputs to the gated-norm
output that o_proj reads: AttnRes (with the block write), input RMSNorm, in_proj, f_b
gate, short conv update, l2norm, the delta-rule recurrence into the step's state slots,
gated RMSNorm. K2 (`mono_kernels_kimi.k2`) runs the rest of a MoE layer from there: o_proj,
its all-reduce, the MLP AttnRes, the latent MoE with its shared experts and the final
all-reduce. Both read vLLM's loaded weights in place (K2 reads its own copy of the routed
experts when vLLM keeps them in another layout than the checkpoint's, e.g. HUMMING's).
Without K2 (a refusal in `k2_reasons`, logged, or a dense layer) the rest of the layer
stays vLLM's: the replaced layer calls the layer's own ``self_attn.o_proj`` and ``mlp``,
and the MLP AttnRes of the vLLM tree it comes from (`mono_vllm.variants`):
``KimiDecoderLayer._post_attn_norm`` in the NVIDIA tree, ``_apply_attn_res`` in the AMD
one (private to vLLM: called, not changed). The two trees also pass the AttnRes prefix
differently between layers. K1 and K2 run on the rank's `MonoRunner` (its scratch, tickets,
tags, health and alarm words), so a wait that gives up makes `after_step` raise on every
rank (the step's last launch ends in the TP fault handshake) and the executor's guard
poison the step. MLA layers stay vLLM's: K2 after vLLM's MLA needs o_proj's input, which
vLLM's NVIDIA MLA layer does not hand out.
"""

from __future__ import annotations

from dataclasses import replace
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


def _k2_offset(k1_scratch: int) -> int:
    """Where K2's scratch starts on the shared runner: past K1's, 256-byte aligned."""
    return -(-k1_scratch // 256) * 256


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


def k2_tail(layer, k2, core, prefix, blocks, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """K2 from o_proj's input: (the layer's output, the prefix after it). A block-write
    layer's prefix restarts at the attention output: K2 writes it into a new tensor, so the
    one passed in (which the layer before may still hold) keeps its values."""
    if layer.is_block_write_layer:
        prefix = prefix.clone()
    return k2(core, prefix, blocks, rows.slots), prefix


def live_rows(state_indices: torch.Tensor, rows: int) -> torch.Tensor:
    """K2's per-row slots of a step from K1's state indices ([R] or [R, L], one a row): the
    row's index, or -1 where the state slot marks a padded request (<= 0)."""
    idx = state_indices.reshape(-1)[:rows]
    own = torch.arange(rows, device=idx.device)
    return torch.where(idx > 0, own, torch.full_like(own, -1))


class StepRows:
    """K2's per-row slots of the current step: the first KDA layer sets them from K1's
    state indices, every K2 launch of the step (MLA layers have no K1 indices) reads them."""

    slots: torch.Tensor | None = None


class K2Launch:
    """K2 on one MoE layer: `self(core, prefix, blocks, slots)` runs it (the prefix
    updated in place) and returns the layer's output."""

    def __init__(self, runner: Any, weights: Any, layer_idx: int, final: bool) -> None:
        self.runner, self.weights, self.layer_idx, self.final = runner, weights, layer_idx, final

    def __call__(self, core, prefix, blocks, slots) -> torch.Tensor:
        return self.runner(
            core, prefix, blocks, self.weights, slots, self.layer_idx, final=self.final
        )


class KdaLayer:
    """One KDA decoder layer on K1 (then K2 when `k2` is given) at one width (what
    `Step.layer(i)` returns), in the calling convention of vLLM's NVIDIA tree:
    ``(positions, hidden_states=delta, residual=blocks, prefix_sum=prefix) -> (MLP
    output, prefix, blocks)``. Without K2: K1, then vLLM's o_proj, MLP AttnRes and MLP."""

    def __init__(
        self,
        layer: Any,
        k1: Any,
        requests: int,
        weights: dict,
        final: bool = False,
        k2: K2Launch | None = None,
        rows: StepRows | None = None,
        first: bool = False,
    ) -> None:
        self.layer, self.k1, self.requests, self.weights = layer, k1, requests, weights
        self.final = final  # K1's launch is the step's last: it ends in the handshake
        self.k2, self.rows, self.first = k2, rows, first

    def core(self, prefix, delta, blocks) -> tuple[torch.Tensor, torch.Tensor]:
        """K1 (which adds `delta` into `prefix` and writes the layer's block): (o_proj's
        input, the step's state indices); the step's first KDA layer also sets the step's
        K2 row slots."""
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

        layer, attn = self.layer, self.layer.self_attn
        md = get_forward_context().attn_metadata[attn.prefix]
        conv_state, state = attn.kv_cache[:2]
        if not is_conv_state_dim_first():
            conv_state = conv_state.transpose(-1, -2)
        spec = self.k1.spec
        indices = md.spec_state_indices_tensor if spec else md.non_spec_state_indices_tensor
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
            state_indices=indices,
            num_accepted=md.num_accepted_tokens if spec else None,
            out=core,
        )
        if self.first and self.rows is not None:
            self.rows.slots = live_rows(indices, prefix.shape[0])
        return core, indices

    def attention(self, prefix, delta, blocks) -> torch.Tensor:
        """K1, then vLLM's o_proj: the attention output."""
        return self.layer.self_attn.o_proj(self.core(prefix, delta, blocks)[0])[0]

    def moe(self, prefix, delta, blocks) -> tuple[torch.Tensor, torch.Tensor]:
        """K1 then K2: (the layer's output, the prefix after it). A block-write layer's
        prefix restarts at the attention output: K2 writes it into a new tensor, so the
        one passed in (which the layer before may still hold) keeps its values."""
        core, _ = self.core(prefix, delta, blocks)
        return k2_tail(self.layer, self.k2, core, prefix, blocks, self.rows)

    def __call__(self, positions, hidden_states, residual, prefix_sum=None, **kwargs):
        if self.k2 is not None:
            out, prefix_sum = self.moe(prefix_sum, hidden_states, residual)
            return out, prefix_sum, residual
        layer = self.layer
        hidden = self.attention(prefix_sum, hidden_states, residual)
        hidden, prefix_sum, residual = layer._post_attn_norm(hidden, residual, prefix_sum)
        return layer.mlp(hidden), prefix_sum, residual


class AmdKdaLayer(KdaLayer):
    """The same in the calling convention of vLLM's AMD tree: ``(positions, prefix,
    blocks, prefix_delta) -> (prefix, blocks, MLP output)``; without K2 the MLP's AttnRes
    is that tree's ``_apply_attn_res`` (a private function of
    vllm/models/kimi_k3/amd/linear.py: called, not changed), with the arguments its
    ``KimiDecoderLayer`` passes."""

    def __call__(self, positions, hidden_states, residual, prefix_delta=None, **kwargs):
        if self.k2 is not None:
            out, prefix = self.moe(hidden_states, prefix_delta, residual)
            return prefix, residual, out
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


class MlaK2Layer:
    """An MLA MoE layer on K2 at one width, in the calling convention of vLLM's NVIDIA tree:
    vLLM's AttnRes (``KimiDecoderLayer._pre_attn_norm``) and MLA up to o_proj's input (its
    ``_forward_q_lora`` / ``_forward_full_rank_q`` and ``_gate_sigmoid_mul``, private to
    vLLM: called, not changed), then K2 from o_proj on."""

    def __init__(self, layer: Any, k2: K2Launch, rows: StepRows) -> None:
        self.layer, self.k2, self.rows = layer, k2, rows

    def core(self, positions, hidden) -> torch.Tensor:
        from vllm.models.kimi_k3.nvidia.mla import _gate_sigmoid_mul

        attn = self.layer.self_attn
        forward = attn._forward_full_rank_q if attn.q_lora_rank is None else attn._forward_q_lora
        out, gate = forward(positions, hidden)
        return out if gate is None else _gate_sigmoid_mul(out, gate)

    def __call__(self, positions, hidden_states, residual, prefix_sum=None, **kwargs):
        layer = self.layer
        hidden, prefix_sum, residual = layer._pre_attn_norm(hidden_states, residual, prefix_sum)
        core = self.core(positions, hidden)
        out, prefix_sum = k2_tail(layer, self.k2, core, prefix_sum, residual, self.rows)
        return out, prefix_sum, residual


class AmdMlaK2Layer(MlaK2Layer):
    """The same in vLLM's AMD tree: its ``_apply_attn_res`` with the arguments its
    ``forward_attn_residual`` passes, and its MLA with ``skip_o_proj`` (what vLLM's own
    AMD K2 calls)."""

    def __call__(self, positions, hidden_states, residual, prefix_delta=None, **kwargs):
        from vllm.models.kimi_k3.amd.linear import _apply_attn_res

        layer = self.layer
        hidden = _apply_attn_res(
            hidden_states,
            residual,
            layer.self_attention_res_proj,
            layer.self_attention_res_norm,
            layer.prev_valid_blocks,
            delta=prefix_delta,
            output_norm=layer.input_layernorm,
            block_write_idx=layer.block_write_idx if layer.is_block_write_layer else -1,
            quant_key=layer.self_attn.get_input_quant_key(),
        )
        core = layer.self_attn.mla_attn.forward(positions, hidden, skip_o_proj=True)
        out, prefix = k2_tail(layer, self.k2, core, hidden_states, residual, self.rows)
        return prefix, residual, out


class KimiKdaKernels:
    """K1 on every KDA layer of one rank, K2 after it on those that are MoE layers (a
    `LayerKernels`)."""

    name = "Kimi-K3 KDA (K1) + MoE (K2)"
    support = KernelSupport(tp=(1, 2, 4, 8, 16), max_rows=16)  # K1's and K2's widest step
    dtypes: dict[str, str] = {}

    def __init__(self, backbone: Any, deployment: Deployment, rank: int, world: int) -> None:
        self.backbone, self.deployment, self.rank, self.world = backbone, deployment, rank, world
        self.variant = variant(backbone)
        self.notes: list[str] = []
        text = backbone.config
        stage = range(backbone.start_layer, backbone.end_layer)
        self.kda_layers = tuple(i for i in stage if text.is_kda_layer(i))
        # K2 runs on every MoE layer: after K1 on a KDA layer, after vLLM's MLA on the rest
        self.moe_layers = tuple(
            i for i in stage if getattr(backbone.layers[i], "is_moe_layer", False)
        )
        self.metadata_key = (
            backbone.layers[self.kda_layers[0]].self_attn.prefix if self.kda_layers else ""
        )
        self._k1: Any = None
        self._k2: Any = None
        self._k2_off: list[str] | None = None  # why K2 does not run (None: not checked yet)

    @property
    def layers(self) -> tuple[int, ...]:
        """The decoder layers the kernels replace: the KDA layers, and the MLA MoE layers
        when K2 runs."""
        if not self.kda_layers or self.k2_off():
            return self.kda_layers
        return tuple(sorted(set(self.kda_layers) | set(self.moe_layers)))

    def check(self) -> list[str]:
        text = self.backbone.config
        kda = text.linear_attn_config or {}
        checks = (
            (not self.kda_layers, "no KDA layers on this rank"),
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
        if not reasons and self.k2_off():
            self.notes.append("K2 off, the MoE layers run vLLM's: " + "; ".join(self.k2_off()))
        return reasons

    def _config(self) -> Any:
        first = self.backbone.layers[self.kda_layers[0]].self_attn
        return kernel_config(
            self.backbone.config, self.world, first.in_proj_qkvgfab.weight.shape[0]
        )

    def _routed(self, i: int) -> Any:
        experts = self.backbone.layers[i].mlp.experts
        return getattr(experts, "routed_experts", experts)

    def _k2_layout(self) -> tuple[Any, bool]:
        """(vLLM's expert layout, whether K2 needs its own copy): vLLM keeps them in
        another layout than the checkpoint's, or padded. ValueError for non-MXFP4."""
        from mono_runtime.stream.sources import ExpertLayout

        layout = mxfp4_layout(self._routed(self.moe_layers[0]))
        if layout is None:
            raise ValueError("routed experts not in MXFP4 (K2 streams MXFP4 experts)")
        cfg = self._config()
        want = {
            "w13": (2 * cfg.routed_intermediate, cfg.latent_size // 2),
            "w2": (cfg.latent_size, cfg.routed_intermediate // 2),
        }
        experts = self._routed(self.moe_layers[0])
        stored = {n: tuple(getattr(experts, f"{n}_weight").shape[1:]) for n in want}
        return layout, layout is not ExpertLayout.K32 or stored != want

    def _k2_weights(self, i: int, copies: bool, layout: Any, device: Any = None) -> Any:
        cfg = self._config()
        experts = None
        if copies:
            experts = unpacked_experts(
                self._routed(i), layout, cfg.latent_size, cfg.routed_intermediate, device
            )
        return k2_weights(self.backbone.layers[i], experts)

    def k2_off(self) -> list[str]:
        """Why K2 does not run on this rank's MoE KDA layers (empty: it does)."""
        if self._k2_off is None:
            self._k2_off = self._k2_reasons()
        return self._k2_off

    def _k2_reasons(self) -> list[str]:
        if not self.moe_layers:
            return ["no MoE layers on this rank"]
        reasons = k2_reasons(self.backbone.config, self.world)
        if self.moe_layers[0] < self.kda_layers[0]:
            reasons.append("a MoE layer before the first KDA layer (K2's row slots come from K1)")
        if reasons:
            return reasons
        from mono_kernels_kimi.k2.spec import K2Build

        try:
            cfg = self._config()
            K2Build(cfg, 1)
            layout, copies = self._k2_layout()
            device = self.backbone.layers[self.kda_layers[0]].input_layernorm.weight.device
            copy = 0
            for i in self.moe_layers:  # what build will unpack, as shapes only (MLA's
                # o_proj must take K2's width: the KDA core's)
                w = self._k2_weights(i, copies, layout, "meta" if copies else None)
                w.validate(cfg, None if copies else device)
                if copies:
                    copy += expert_bytes(w)
        except ValueError as err:
            return [f"loaded weights: {err}"]
        too_big = copy_reason(copy, device, "K2")  # K2 off, K1 still runs
        return [] if too_big is None else [too_big]

    def _k1_bytes(self, widths) -> tuple[int, int]:
        from mono_kernels_kimi.kda.runner import runner_bytes

        q = self.deployment.q
        device = self.backbone.layers[self.kda_layers[0]].input_layernorm.weight.device
        return runner_bytes(self._config(), device, q, self.world, spec=q > 1, max_rows=max(widths))

    def runner_bytes(self, widths) -> tuple[int, int]:
        scratch, peer = self._k1_bytes(widths)
        if self.k2_off():
            return scratch, peer
        from mono_kernels_kimi.k2.spec import K2Build, peer_bytes, scratch_bytes

        cfg, copies = self._config(), self._k2_layout()[1]
        k2 = sum(scratch_bytes(K2Build(cfg, w, packed=copies)) for w in widths)
        return _k2_offset(scratch) + k2, max(peer, peer_bytes(cfg))

    def build(self, runner: Any, widths) -> dict[int, dict[int, KdaLayer]]:
        from mono_kernels_kimi.kda.runner import KdaRunner

        q, layers = self.deployment.q, self.backbone.layers
        device = layers[self.kda_layers[0]].input_layernorm.weight.device
        self._k1 = KdaRunner(
            self._config(), device, q, spec=q > 1, max_rows=max(widths), runner=runner
        )
        self._k1.warm()  # compiles and loads every width: before profiling and capture
        weights = {i: k1_weights(layers[i]) for i in self.kda_layers}
        k2 = {} if self.k2_off() else self._build_k2(runner, widths)
        last = max(self.layers)  # its launch is the step's last: it ends in the handshake
        amd = self.variant == AMD
        kda, mla = (AmdKdaLayer, AmdMlaK2Layer) if amd else (KdaLayer, MlaK2Layer)
        first = self.kda_layers[0]
        table = {}
        for w in widths:
            rows = StepRows() if k2 else None  # K2's row slots: the first KDA layer sets them
            table[w] = {
                i: kda(layers[i], self._k1, w // q, weights[i], i == last and i not in k2,
                       k2.get(i), rows, i == first)
                if i in weights
                else mla(layers[i], k2[i], rows)
                for i in self.layers
            }  # fmt: skip
        return table

    def _build_k2(self, runner: Any, widths) -> dict[int, K2Launch]:
        """K2 on the shared runner (its scratch past K1's) and each MoE KDA layer's weights
        (vLLM's, or the kernel's own copy of the experts, packed into mxfp4-rot)."""
        from mono_kernels_kimi.k2.runner import K2Runner

        cfg = self._config()
        layout, copies = self._k2_layout()
        k1_scratch = self._k1_bytes(widths)[0]
        # sharing vLLM's experts, K2 streams them as they are (vLLM's MoE reads them too);
        # its own copy it packs into its fastest layout
        self._k2 = K2Runner(
            cfg, runner.group, self.rank, runner.device, widths=list(widths),
            runner=runner, pack=copies, scratch_offset=_k2_offset(k1_scratch),
        )  # fmt: skip
        self._k2.warm()
        weights = {i: self._k2.pack(self._k2_weights(i, copies, layout)) for i in self.moe_layers}
        if copies:
            size = sum(expert_bytes(w) for w in weights.values())
            self.notes.append(
                f"routed experts copied from vLLM's {layout.value} layout into K2's "
                f"({size / 2**30:.1f} GiB per rank; vLLM's MoE keeps its own for other steps)"
            )
        last = max(self.moe_layers[-1], self.kda_layers[-1])
        return {i: K2Launch(self._k2, weights[i], i, i == last) for i in self.moe_layers}

    def step_begin(self, runner: Any) -> None:
        runner.step_begin()  # bumps the epoch once; K1 and K2 draw tag slots from 0

    def close(self) -> None:
        if self._k2 is not None:
            self._k2.close()  # the shared MonoRunner stays open: the executor closes it
        self._k1 = self._k2 = None

    def _states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        state = self.backbone.layers[self.kda_layers[0]].self_attn.kv_cache
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
