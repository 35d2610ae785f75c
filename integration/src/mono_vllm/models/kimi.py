"""Kimi-K3 with mono: vLLM's text model class plus the executor's hooks (KDA layers take
K1). The checkpoint's top-level ``KimiK3ForConditionalGeneration`` builds its text model
through the registry under ``KimiLinearForCausalLM`` and hands it forward, logits and the
model-state class, so registering this class is enough."""

from __future__ import annotations

from vllm.models.kimi_k3 import KimiLinearForCausalLM

from ..families.kimi import KimiKdaKernels
from .text import MonoTextModel


class MonoKimiLinearForCausalLM(MonoTextModel, KimiLinearForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._init_mono(vllm_config, KimiKdaKernels)
