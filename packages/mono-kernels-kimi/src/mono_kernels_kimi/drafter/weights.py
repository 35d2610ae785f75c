"""The DSpark draft model's weights as one TP rank holds them: the engine's tensors.

Shapes on one rank (H hidden, QL q_lora_rank, L kv_lora_rank, R qk_rope_head_dim, P
qk_nope_head_dim, V v_head_dim, n local heads, I local intermediate), as vLLM 0.33 loads
K3DSparkModel (vllm/models/kimi_k3/nvidia/dspark_mla.py, mla.py, model.py), bf16 unless
said:

    input_layernorm           [H]              RMSNorm before attention
    fused_qkv_a_proj          [QL + L + R, H]  q_a_proj rows then kv_a_proj_with_mqa rows
                                               (MergedColumnParallelLinear, disable_tp:
                                               whole on every rank)
    q_a_layernorm             [QL]
    kv_a_layernorm            [L]
    q_b_proj                  [n (P + R), QL]  ColumnParallelLinear: this rank's heads,
                                               each head's rows [nope | rope]
    kv_b_proj                 [n (P + V), L]   ColumnParallelLinear: this rank's heads, each
                                               head's rows [k_nope | v]; vLLM splits it once
                                               into W_UK (query absorption) and W_UV
    o_proj                    [H, n V]         RowParallelLinear: this rank's columns
    post_attention_layernorm  [H]
    gate_up_proj              [2 I, H]         MergedColumnParallelLinear: this rank's gate
                                               rows then its up rows
    down_proj                 [H, I]           RowParallelLinear: this rank's columns
    k_scale, q_scale          []  fp32         the layer's `_k_scale` / `_q_scale` (fp8
                                               cache only; 1.0 when the checkpoint has none)

plus the model's `final_norm` [H]. The context projection (`context_proj`,
`context_norm`), the Markov head and the shared embedding / LM head are not the drafter
kernels' weights (FACTS.md says where each runs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from mono_runtime.kernel import same_device

from .config import DrafterConfig

BF16, F32 = torch.bfloat16, torch.float32


@dataclass(frozen=True)
class DrafterLayerWeights:
    input_layernorm: torch.Tensor
    fused_qkv_a_proj: torch.Tensor
    q_a_layernorm: torch.Tensor
    kv_a_layernorm: torch.Tensor
    q_b_proj: torch.Tensor
    kv_b_proj: torch.Tensor
    o_proj: torch.Tensor
    post_attention_layernorm: torch.Tensor
    gate_up_proj: torch.Tensor
    down_proj: torch.Tensor
    k_scale: torch.Tensor
    q_scale: torch.Tensor

    @staticmethod
    def expected(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of every tensor of one layer at `cfg` (its tp)."""
        h, il = cfg.hidden_size, cfg.local_intermediate
        return {
            "input_layernorm": ((h,), BF16),
            "fused_qkv_a_proj": ((cfg.qkv_a_rows, h), BF16),
            "q_a_layernorm": ((cfg.q_lora_rank,), BF16),
            "kv_a_layernorm": ((cfg.kv_lora_rank,), BF16),
            "q_b_proj": ((cfg.q_b_rows, cfg.q_lora_rank), BF16),
            "kv_b_proj": ((cfg.kv_b_rows, cfg.kv_lora_rank), BF16),
            "o_proj": ((h, cfg.o_proj_in), BF16),
            "post_attention_layernorm": ((h,), BF16),
            "gate_up_proj": ((2 * il, h), BF16),
            "down_proj": ((h, il), BF16),
            "k_scale": ((), F32),
            "q_scale": ((), F32),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def w_uk(self, cfg: DrafterConfig) -> torch.Tensor:
        """[n, P, L]: kv_b_proj's k_nope rows per head (`W_UK_T` of `split_kv_b_proj`),
        which take the query's nope part into the latent space."""
        w = self.kv_b_proj.view(cfg.local_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
        return w[:, : cfg.qk_nope_head_dim]

    def w_uv(self, cfg: DrafterConfig) -> torch.Tensor:
        """[n, L, V]: kv_b_proj's v rows per head, transposed (`W_UV`), which take the
        latent attention output to the head's value."""
        w = self.kv_b_proj.view(cfg.local_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
        return w[:, cfg.qk_nope_head_dim :].transpose(1, 2)


@dataclass(frozen=True)
class DrafterWeights:
    layers: tuple[DrafterLayerWeights, ...]
    final_norm: torch.Tensor

    def validate(self, cfg: DrafterConfig, device: torch.device | None = None) -> None:
        """Raise ValueError naming the first tensor whose shape, dtype, layout, alignment or
        device differs from what the drafter reads (another model's or another TP's
        weights, or a view at an odd offset)."""
        if len(self.layers) != cfg.num_hidden_layers:
            raise ValueError(
                f"weights.layers: {len(self.layers)} layers, expected {cfg.num_hidden_layers}"
            )
        named = [
            (f"layers[{i}].{name}", getattr(layer, name), want)
            for i, layer in enumerate(self.layers)
            for name, want in DrafterLayerWeights.expected(cfg).items()
        ]
        named.append(("final_norm", self.final_norm, ((cfg.hidden_size,), BF16)))
        for name, t, (shape, dtype) in named:
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"weights.{name}: expected a tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape:
                raise ValueError(f"weights.{name}: shape {tuple(t.shape)}, expected {shape}")
            if t.dtype != dtype:
                raise ValueError(f"weights.{name}: dtype {t.dtype}, expected {dtype}")
            if not t.is_contiguous():
                raise ValueError(f"weights.{name}: must be contiguous (strides {t.stride()})")
            if t.data_ptr() % 16:
                raise ValueError(
                    f"weights.{name}: address {t.data_ptr():#x} is not 16-byte aligned (the "
                    "kernel streams weights by 16-byte copies)"
                )
            if device is not None and not same_device(t.device, device):
                raise ValueError(f"weights.{name}: on {t.device}, expected {device}")


def random_weights(
    cfg: DrafterConfig, seed: int = 0, rank: int = 0, device: str | torch.device = "cpu"
) -> DrafterWeights:
    """Rank `rank`'s random weights. What vLLM replicates (norms, fused_qkv_a_proj, the
    fp8 scales) comes from `seed` alone, the shards from (`seed`, `rank`). Magnitudes keep
    activations and attention logits O(1) so that bf16 comparisons mean something; the fp8
    scales are not 1, so that a missing scale shows."""
    h, ql, lat = cfg.hidden_size, cfg.q_lora_rank, cfg.kv_lora_rank
    device = torch.device(device)
    whole = torch.Generator().manual_seed(seed)
    shard = torch.Generator().manual_seed(seed * 7919 + rank + 1_000_003)

    def bf16(g, *shape, std=1.0, mean=0.0):
        return (mean + std * torch.randn(*shape, generator=g)).to(BF16).to(device)

    def norm(g, n):
        return bf16(g, n, std=0.1, mean=1.0)

    layers = []
    for _ in range(cfg.num_hidden_layers):
        layers.append(
            DrafterLayerWeights(
                input_layernorm=norm(whole, h),
                fused_qkv_a_proj=bf16(whole, cfg.qkv_a_rows, h, std=h**-0.5),
                q_a_layernorm=norm(whole, ql),
                kv_a_layernorm=norm(whole, lat),
                q_b_proj=bf16(shard, cfg.q_b_rows, ql, std=ql**-0.5),
                kv_b_proj=bf16(shard, cfg.kv_b_rows, lat, std=lat**-0.5),
                o_proj=bf16(shard, h, cfg.o_proj_in, std=cfg.v_head_dim**-0.5),
                post_attention_layernorm=norm(whole, h),
                gate_up_proj=bf16(shard, 2 * cfg.local_intermediate, h, std=h**-0.5),
                down_proj=bf16(shard, h, cfg.local_intermediate, std=cfg.intermediate_size**-0.5),
                k_scale=torch.tensor(0.5, dtype=F32, device=device),
                q_scale=torch.tensor(0.25, dtype=F32, device=device),
            )
        )
    return DrafterWeights(layers=tuple(layers), final_norm=norm(whole, h))
