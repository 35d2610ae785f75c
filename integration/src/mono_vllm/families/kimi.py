"""Kimi-K3: every KDA decoder layer takes K1.

K1 (`mono_kernels_kimi.kda`) runs a KDA layer from its AttnRes inputs to the gated-norm
output that o_proj reads: AttnRes (with the block write), input RMSNorm, in_proj, f_b
gate, short conv update, l2norm, the delta-rule recurrence into the step's state slots,
gated RMSNorm. It reads vLLM's loaded weights and KDA states in place. The rest of the
layer (o_proj, the MLP AttnRes and the MoE) stays vLLM's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..deployment import Deployment, KernelSupport


class KimiKdaKernels:
    """K1 on every KDA layer of one rank (a `LayerKernels`)."""

    name = "Kimi-K3 KDA (K1)"
    support = KernelSupport(tp=(1, 2, 4, 8, 16), max_rows=8)
    dtypes: dict[str, str] = {}

    def __init__(self, backbone: Any, deployment: Deployment, rank: int, world: int) -> None:
        self.backbone, self.deployment, self.rank, self.world = backbone, deployment, rank, world
        text = backbone.config
        stage = range(backbone.start_layer, backbone.end_layer)
        self.layers = tuple(i for i in stage if text.is_kda_layer(i))
        self.metadata_key = backbone.layers[self.layers[0]].self_attn.prefix if self.layers else ""

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
        return [why for bad, why in checks if bad]

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
