"""vLLM's entry point into mono (``vllm.general_plugins`` -> ``mono = mono_vllm.plugin:register``).

vLLM calls `register` in every process it starts (API server, engine core, each worker),
possibly more than once. On the platforms the kernels have builds for (CUDA and ROCm) it
registers mono's model classes over vLLM's for the architectures the kernels serve; they
subclass the class vLLM itself exports on that platform (its NVIDIA or its AMD tree) and
behave exactly like it unless ``additional_config`` sets ``mono_decode``. Elsewhere (CPU,
XPU, TPU) vLLM's classes stay. The classes are named lazily (``module:class``) so that
registering imports no model code and initialises no GPU.
"""

from __future__ import annotations

# architecture -> mono's class (a subclass of vLLM's class of that name)
MODELS: dict[str, str] = {
    "MiniMaxM3SparseForCausalLM": "mono_vllm.models.minimax:MonoMiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration": (
        "mono_vllm.models.minimax:MonoMiniMaxM3SparseForConditionalGeneration"
    ),
    # Kimi-K3's checkpoint names KimiK3ForConditionalGeneration, which builds its text
    # model through the registry as "KimiLinearForCausalLM" and hands it forward, logits
    # and the model-state class: registering the text model is enough.
    "KimiLinearForCausalLM": "mono_vllm.models.kimi:MonoKimiLinearForCausalLM",
    # Kimi-K3's DSpark draft model (`--speculative-config '{"method": "dspark", ...}'`)
    "K3DSparkModel": "mono_vllm.models.dspark:MonoK3DSparkForCausalLM",
}


def register() -> None:
    """Registers mono's classes with vLLM's ModelRegistry on CUDA and ROCm (idempotent)."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() or current_platform.is_rocm()):
        return
    for arch, cls in MODELS.items():
        ModelRegistry.register_model(arch, cls)
