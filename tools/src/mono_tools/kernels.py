"""The kernel packages' build modules that `mono qualify` and `mono bench` load into
mono_runtime's registry: importing one registers its builds. The runtime names no model,
so the list lives here, with the commands that iterate it."""

from __future__ import annotations

BUILD_MODULES = (
    "mono_kernels_minimax.ffn.build",
    "mono_kernels_kimi.kda.build",
    "mono_kernels_kimi.k2.build",
    "mono_kernels_kimi.drafter.build",
)


def load() -> dict[str, str]:
    """Register every build; {module: why it is absent} for a package not installed."""
    from mono_runtime.kernel import registry

    return registry.load(BUILD_MODULES)
