"""Kimi-K3 text-model sizes the kernels are written for, and a tiny variant for tests.

The field names follow vLLM 0.33's `KimiLinearConfig` (hidden_size, rms_norm_eps,
attn_res_block_size, linear_attn_config's num_heads / head_dim / short_conv_kernel_size /
gate_lower_bound / kda_layers) so that an engine adapter can check a loaded model
against them field by field. Per-rank sizes follow `KimiK3DeltaAttention.__init__`
(vllm/models/kimi_k3/nvidia/kda.py): the merged in_proj holds q|k|v|g (4 x the local
projection), f_a (head_dim rows, replicated on every rank), beta (local heads) and zero
padding up to a multiple of 16 rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property


def _default_kda_layers(num_layers: int) -> tuple[int, ...]:
    # 1-based layer numbers (vLLM's `is_kda_layer` tests `layer_idx + 1`): three KDA
    # layers then one MLA layer, and the last layer MLA -> 69 KDA + 24 MLA of 93.
    # The real checkpoint's list is not in the wheel; an adapter must pass the
    # loaded config's list rather than rely on this one.
    return tuple(n for n in range(1, num_layers) if n % 4 != 0)


@dataclass(frozen=True)
class KimiK3Config:
    """Model sizes (whole model, not per rank) plus the tensor-parallel degree."""

    hidden_size: int = 7168
    num_hidden_layers: int = 93
    kda_num_heads: int = 96
    kda_head_dim: int = 128
    conv_kernel_size: int = 4
    gate_lower_bound: float = -5.0
    rms_norm_eps: float = 1e-6
    o_norm_eps: float = 1e-5  # FusedRMSNormGated's default, as the KDA layer builds it
    # AttnRes: one block of residual sources per `attn_res_block_size` layers.
    attn_res_block_size: int = 12
    kda_layers: tuple[int, ...] = _default_kda_layers(93)
    tp: int = 8
    in_proj_alignment: int = 16  # bf16 in_proj; vLLM uses 128 for FP8_PB_WO weights
    # Latent MoE (`KimiMoE`): routed experts run in the latent space of
    # `routed_expert_hidden_size`; the shared experts in the hidden space.
    routed_expert_hidden_size: int = 3584
    num_experts: int = 896
    num_experts_per_token: int = 16
    moe_intermediate_size: int = 3072  # 384 a rank at TP 8
    num_shared_experts: int = 2  # shared intermediate 6144: 768 a rank at TP 8
    routed_scaling_factor: float = 1.0
    moe_renormalize: bool = True
    latent_moe_use_norm: bool = True
    activation_situ_beta: float = 4.0
    activation_situ_linear_beta: float = 25.0

    def __post_init__(self) -> None:
        if self.kda_num_heads % self.tp:
            raise ValueError(f"kda_num_heads {self.kda_num_heads} not divisible by tp {self.tp}")
        if self.conv_kernel_size != 4:
            raise ValueError("conv_kernel_size must be 4 (the kernels unroll a width-4 conv)")
        if not -5.0 <= self.gate_lower_bound < 0:
            raise ValueError(f"gate_lower_bound {self.gate_lower_bound} outside [-5, 0)")
        for name, size in (
            ("hidden_size", self.hidden_size),
            ("routed_expert_hidden_size", self.routed_expert_hidden_size),
            ("num_experts", self.num_experts),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ):
            if size % self.tp:
                raise ValueError(f"{name} {size} not divisible by tp {self.tp}")
        if not 0 < self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"num_experts_per_token {self.num_experts_per_token} outside "
                f"1..num_experts ({self.num_experts})"
            )

    @classmethod
    def tiny(cls, tp: int = 1) -> KimiK3Config:
        """Same structure, sizes small enough for the Triton interpreter."""
        return cls(
            hidden_size=64,
            num_hidden_layers=8,
            kda_num_heads=2 * tp,
            kda_head_dim=16,
            attn_res_block_size=2,
            kda_layers=_default_kda_layers(8),
            tp=tp,
            routed_expert_hidden_size=64,
            num_experts=16,
            num_experts_per_token=4,
            moe_intermediate_size=32 * tp,  # one MXFP4 scale group a rank
            num_shared_experts=1,
        )

    def with_tp(self, tp: int) -> KimiK3Config:
        return replace(self, tp=tp)

    # ---- per-rank sizes -------------------------------------------------------------
    @property
    def local_heads(self) -> int:
        return self.kda_num_heads // self.tp

    @property
    def local_proj(self) -> int:
        """Channels of each of q, k, v, g on one rank (local heads x head_dim)."""
        return self.local_heads * self.kda_head_dim

    @property
    def qkv_dim(self) -> int:
        """Channels of the packed conv input (q|k|v) and of one conv-state entry."""
        return 3 * self.local_proj

    @property
    def f_a_dim(self) -> int:
        return self.kda_head_dim

    @property
    def in_proj_rows_unpadded(self) -> int:
        return 4 * self.local_proj + self.f_a_dim + self.local_heads

    @property
    def in_proj_rows(self) -> int:
        rows = self.in_proj_rows_unpadded
        return rows + (-rows % self.in_proj_alignment)

    # column offsets inside one in_proj output row
    @property
    def g_offset(self) -> int:
        return self.qkv_dim

    @property
    def f_a_offset(self) -> int:
        return 4 * self.local_proj

    @property
    def beta_offset(self) -> int:
        return self.f_a_offset + self.f_a_dim

    # ---- K2: o_proj and the latent MoE, per rank -------------------------------------
    @property
    def o_proj_in(self) -> int:
        """o_proj's input channels on one rank: the KDA core (local heads x head_dim);
        an MLA layer's o_proj input has the same width (vLLM's AMD K2 checks one o_proj
        shape for both layer kinds)."""
        return self.local_proj

    @property
    def latent_size(self) -> int:
        return self.routed_expert_hidden_size

    @property
    def routed_intermediate(self) -> int:
        """One routed expert's intermediate on one rank (experts are TP-sharded)."""
        return self.moe_intermediate_size // self.tp

    @property
    def shared_intermediate(self) -> int:
        """The shared experts' intermediate on one rank (`KimiMLP` is TP-sharded)."""
        return self.moe_intermediate_size * self.num_shared_experts // self.tp

    @property
    def experts_per_rank(self) -> int:
        """Router rows one rank computes (the kernel shards the replicated router)."""
        return self.num_experts // self.tp

    @property
    def latent_per_rank(self) -> int:
        """Latent down-projection rows one rank computes (sharded like the router)."""
        return self.routed_expert_hidden_size // self.tp

    @property
    def hidden_per_rank(self) -> int:
        """Up-projection output columns one rank computes."""
        return self.hidden_size // self.tp

    def mlp_attn_res(self, layer_idx: int) -> tuple[int, bool]:
        """(block sources, reset) of a layer's MLP AttnRes, as
        `KimiDecoderLayer._post_attn_norm` derives them (nvidia/model.py): a block-write
        layer restarts the prefix at the attention output and counts one block more."""
        prev_valid, write = self.attn_res_blocks(layer_idx)
        return prev_valid + (write >= 0), write >= 0

    # ---- layers ---------------------------------------------------------------------
    def is_kda_layer(self, layer_idx: int) -> bool:
        return (layer_idx + 1) in self.kda_layers

    @cached_property
    def num_kda_layers(self) -> int:
        return sum(self.is_kda_layer(i) for i in range(self.num_hidden_layers))

    def attn_res_blocks(self, layer_idx: int) -> tuple[int, int]:
        """(sources before the prefix, block written or -1) for a layer's pre-attention
        AttnRes, as `KimiDecoderLayer.__init__` derives them (nvidia/model.py)."""
        bs = self.attn_res_block_size
        prev_valid = -(-layer_idx // bs)
        write = layer_idx // bs if layer_idx % bs == 0 else -1
        return prev_valid, write

    @property
    def num_attn_res_blocks(self) -> int:
        return -(-self.num_hidden_layers // self.attn_res_block_size)
