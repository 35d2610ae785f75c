"""Which of vLLM 0.33's per-vendor model implementations a loaded module belongs to.

vLLM keeps MiniMax-M3 and Kimi-K3 in two trees, ``vllm/models/<model>/nvidia/`` (CUDA) and
``.../amd/`` (ROCm), and its model package exports the one of the running platform. The
trees differ where the plugin's layer hooks join vLLM's layers (who all-reduces a MoE
output, how a Kimi-K3 layer passes its AttnRes prefix), so a family asks which tree its
backbone comes from rather than guessing from the attributes it finds.
"""

from __future__ import annotations

from typing import Any

NVIDIA, AMD = "nvidia", "amd"


def variant(module: Any) -> str:
    """``"nvidia"`` or ``"amd"``: the tree of vLLM's models that `module`'s class is from."""
    path = type(module).__module__.split(".")
    for name in (NVIDIA, AMD):
        if name in path:
            return name
    raise ValueError(
        f"{type(module).__qualname__} ({type(module).__module__}) is from neither of vLLM's "
        "vendor trees (vllm.models.<model>.nvidia / .amd)"
    )
