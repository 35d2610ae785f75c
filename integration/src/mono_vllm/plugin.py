"""vLLM's entry point into mono (``vllm.general_plugins`` -> ``mono = mono_vllm.plugin:register``).

vLLM calls `register` in every process it starts (API server, engine core, each worker),
possibly more than once. It registers mono's model classes over vLLM's for the
architectures the kernels serve. The classes are named lazily (``module:class``) so that
registering imports no model code and initialises no GPU; they subclass vLLM's own
classes and behave exactly like them unless ``additional_config`` sets ``mono_decode``.
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
}


def register() -> None:
    """Registers mono's classes with vLLM's ModelRegistry (idempotent)."""
    from vllm import ModelRegistry

    for arch, cls in MODELS.items():
        ModelRegistry.register_model(arch, cls)
