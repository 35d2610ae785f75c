"""MiniMax-M3 with mono: vLLM's classes plus the executor's hooks (sparse MoE layers take
the FFN kernel). ``vllm.models.minimax_m3`` exports the classes of vLLM's NVIDIA tree on
CUDA and of its AMD tree on ROCm; mono subclasses whichever it exports."""

from __future__ import annotations

from vllm.models.minimax_m3 import (
    MiniMaxM3SparseForCausalLM,
    MiniMaxM3SparseForConditionalGeneration,
)

from ..families.minimax import MiniMaxFfnKernels
from .text import mono_class

MonoMiniMaxM3SparseForCausalLM = mono_class(MiniMaxM3SparseForCausalLM, MiniMaxFfnKernels, __name__)


class MonoMiniMaxM3SparseForConditionalGeneration(MiniMaxM3SparseForConditionalGeneration):
    """The checkpoint's top-level class; its text model (built through the registry) is
    `MonoMiniMaxM3SparseForCausalLM`. vLLM asks the top-level model for its state class,
    which vLLM's NVIDIA class does not hand over: this one hands over the text model's."""

    def get_model_state_cls(self):
        return self.language_model.get_model_state_cls()
