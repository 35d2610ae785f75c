"""vLLM's loaded MoE experts as the kernels read them, for every model family.

vLLM's MXFP4 MoE backends leave the experts in their own layouts; `mxfp4_layout` names
the one a layer holds (refusing those mono cannot read back), and `unpacked_experts` makes
the kernel's own ``mxfp4-k32`` copy through `mono_runtime.stream.sources`.
"""

from __future__ import annotations

from typing import Any

import torch


def _layouts() -> dict[str, Any]:
    from mono_runtime.stream.sources import ExpertLayout

    # vLLM's MXFP4 MoE backends (Mxfp4MoeBackend names) by the layout they leave
    return {
        "EMULATION": ExpertLayout.K32,
        "B12X_MXFP4_BF16": ExpertLayout.K32,
        "B12X_MXFP4_MXFP8": ExpertLayout.K32,
        "HUMMING": ExpertLayout.HUMMING,
        "AITER_MXFP4_BF16": ExpertLayout.AITER_A16W4,
        "AITER_MXFP4_MXFP4": ExpertLayout.AITER_A4W4,
    }


def mxfp4_layout(experts: Any) -> Any:
    """The `ExpertLayout` of MXFP4 experts (`experts`: vLLM's ``RoutedExperts``), None when
    vLLM's MoE method is not MXFP4; ValueError for a layout mono does not read."""
    from mono_runtime.stream.sources import ExpertLayout

    backend = getattr(experts.quant_method, "mxfp4_backend", None)
    if backend is None:
        return None
    layouts = _layouts()
    layout = layouts.get(backend.name)
    if layout is None:
        raise ValueError(
            f"MXFP4 experts in the layout of vLLM's {backend.name} MoE backend (mono reads "
            f"those of {', '.join(layouts)}; --moe-backend emulation keeps the checkpoint's)"
        )
    if layout is ExpertLayout.HUMMING:
        cfg = experts.humming_configs["w13"]
        if cfg.sm_version // 10 != 9 or cfg.a_dtype.num_bits != 16 or cfg.use_fused_e8m0_scale:
            raise ValueError(
                f"HUMMING experts for sm{cfg.sm_version} with {cfg.a_dtype} activations "
                "(mono unpacks HUMMING's SM90 layout for 16-bit activations)"
            )
    shuffled = getattr(experts.w13_weight, "is_shuffled", False)
    if layout in (ExpertLayout.AITER_A16W4, ExpertLayout.AITER_A4W4) and not shuffled:
        raise ValueError(f"{backend.name} experts that AITER's shuffle did not rewrite")
    return layout


# What a rank keeps beside vLLM's routed experts and a kernel's copy of them: the rest of
# the model's weights, activations, graphs and a minimal KV cache
COPY_MARGIN = 8 << 30


def expert_bytes(weights: Any) -> int:
    """Bytes of a layer's routed experts in a kernel's weight bundle (FfnWeights or
    K2Weights, or a dry run of one on the meta device): w13, w2 and their scales."""
    return sum(getattr(weights, n).nbytes for n in ("w13", "w13_scale", "w2", "w2_scale"))


def copy_reason(nbytes: int, device: Any, kernel: str) -> str | None:
    """Why `kernel` cannot hold its own copy of the routed experts (`nbytes` a rank); None
    when it fits. vLLM's experts already take about as much, so twice the copy and
    COPY_MARGIN must fit the GPU: judged on its total memory, which every rank of a
    deployment (one GPU model) reads alike, so the ranks agree without a collective, and
    before any of the copy is made (it would fail as an out-of-memory error, naming no
    setting)."""
    total = device_memory(device)
    if total is None or 2 * nbytes + COPY_MARGIN <= total:
        return None
    return (
        f"{kernel}'s own copy of the routed experts ({nbytes / 2**30:.1f} GiB a rank, beside "
        f"vLLM's) does not fit a {total / 2**30:.0f} GiB GPU; --moe-backend emulation keeps "
        f"the checkpoint's layout, which {kernel} reads in place"
    )


def device_memory(device: Any) -> int | None:
    """Total bytes of a CUDA (or ROCm) device's memory; None for any other device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def weight_and_scale(module: Any, prefix: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, scale or None) of a loaded linear or expert module, as tensors."""
    weight = getattr(module, f"{prefix}weight")
    scale = getattr(module, f"{prefix}weight_scale", None)
    if scale is None:
        scale = getattr(module, f"{prefix}weight_scale_inv", None)
    return weight.data, None if scale is None else scale.data


def unpacked_experts(
    experts: Any, layout: Any, hidden: int, intermediate: int, device: Any = None
) -> dict:
    """The kernel's own mxfp4-k32 copy of the experts vLLM keeps in `layout` (w13, w2 and
    their scales; `hidden` is the experts' input width, `intermediate` one rank's), on
    `device` (``"meta"``: shapes only, nothing copied)."""
    from mono_runtime.stream.sources import unpack_experts

    h, i = hidden, intermediate
    up = experts.moe_config.intermediate_size_per_partition  # vLLM's, maybe rounded up
    out = {}
    for name, n, k, up_row in (("w13", 2 * i, h, up), ("w2", h, i, None)):
        codes, scales = weight_and_scale(experts, f"{name}_")
        if device == "meta":
            codes, scales = codes.to("meta"), scales.to("meta")
        e = codes.shape[0]
        dev = codes.device if device is None else device
        into = (torch.empty(e, n, k // 2, dtype=torch.uint8, device=dev),
                torch.empty(e, n, k // 32, dtype=torch.uint8, device=dev))  # fmt: skip
        out[name], out[f"{name}_scale"] = unpack_experts(
            layout, codes, scales, n, k, up_row=up_row, out=into
        )
    return out
