"""Kimi-K3's DSpark draft model with mono: vLLM's ``K3DSparkForCausalLM`` whose draft layers
and final norm run on the drafter kernels (`mono_vllm.drafter`) when ``mono_decode`` is
set. vLLM has one implementation of it (its NVIDIA tree), which its registry names for
``K3DSparkModel`` on every platform."""

from __future__ import annotations

from vllm.models.kimi_k3.nvidia.dspark_mla import K3DSparkForCausalLM

from ..drafter import MonoDrafter


class MonoK3DSparkForCausalLM(K3DSparkForCausalLM):
    mono: MonoDrafter | None = None

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.mono = MonoDrafter.requested(vllm_config, self)

    def forward(self, input_ids, positions, inputs_embeds=None):
        if self.mono is not None:
            out = self.mono.forward(input_ids, positions, inputs_embeds)
            if out is not None:
                return out
        return super().forward(input_ids, positions, inputs_embeds)

    def load_weights(self, weights):
        if self.mono is not None:
            self.mono.refuse_reload()
        return super().load_weights(weights)
