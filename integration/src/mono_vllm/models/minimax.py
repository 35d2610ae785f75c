"""MiniMax-M3 with mono: vLLM's classes plus the executor's hooks (sparse MoE layers take
the FFN kernel)."""

from __future__ import annotations

from vllm.models.minimax_m3 import (
    MiniMaxM3SparseForCausalLM,
    MiniMaxM3SparseForConditionalGeneration,
)

from ..families.minimax import MiniMaxFfnKernels
from .text import MonoTextModel


class MonoMiniMaxM3SparseForCausalLM(MonoTextModel, MiniMaxM3SparseForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_mono(vllm_config, MiniMaxFfnKernels)

    def compute_logits_local(self, hidden_states):
        # the batch-sharded sampler's logits: the same fault check as compute_logits
        if self.mono is not None:
            self.mono.after_step()
        return super().compute_logits_local(hidden_states)


class MonoMiniMaxM3SparseForConditionalGeneration(MiniMaxM3SparseForConditionalGeneration):
    """The checkpoint's top-level class; its text model (built through the registry) is
    `MonoMiniMaxM3SparseForCausalLM`. vLLM asks the top-level model for its state class,
    and on NVIDIA this one has none of its own: hand over the text model's."""

    def get_model_state_cls(self):
        return self.language_model.get_model_state_cls()
