"""Kimi-K3 with mono: vLLM's text model class plus the executor's hooks (KDA layers take
K1). The checkpoint's top-level ``KimiK3ForConditionalGeneration`` builds its text model
through the registry under ``KimiLinearForCausalLM`` and hands it forward, logits and the
model-state class, so registering this class is enough. ``vllm.models.kimi_k3`` exports
the class of vLLM's NVIDIA tree on CUDA and of its AMD tree on ROCm."""

from __future__ import annotations

from vllm.models.kimi_k3 import KimiLinearForCausalLM

from ..families.kimi import KimiKdaKernels
from .text import mono_class

MonoKimiLinearForCausalLM = mono_class(KimiLinearForCausalLM, KimiKdaKernels, __name__)
