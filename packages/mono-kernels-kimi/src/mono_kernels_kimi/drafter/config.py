"""The DSpark draft model's sizes the drafter kernels are written against, the real
Kimi-K3 drafter (`k3_dspark`) and a tiny variant of the same structure (`tiny`).

Field names are the attributes of vLLM 0.33's `K3DSparkConfig` (a `DeepseekV3Config`;
vllm/transformers_utils/configs/k3_dspark.py), its `rope_parameters` entries, and of
`CacheConfig` (`cache_dtype`, `block_size`) and `SpeculativeConfig`
(`num_speculative_tokens`), so that an engine adapter can compare a loaded draft model
with this config field by field. Sizes are the whole model's; the per-rank properties
follow how `MultiHeadLatentAttention` and `KimiMLP` shard their weights
(vllm/models/kimi_k3/nvidia/mla.py, model.py). FACTS.md says where each value comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# CacheConfig.cache_dtype strings the draft layers serve: "auto" is the model dtype (bf16).
# "fp8_ds_mla" (a 656-byte block-scaled layout) and e5m2 are refused.
CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
HIDDEN_ACTS = ("silu", "situ")  # what KimiMLP accepts


@dataclass(frozen=True)
class DrafterConfig:
    """A dense-MLA DSpark draft model (whole-model sizes) plus the tensor-parallel degree."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    num_speculative_tokens: int
    block_size: int
    tp: int
    cache_dtype: str = "auto"
    rope_type: str = "default"
    sample_from_anchor: bool = True
    # The attention kind of the draft layers; only MLA (K3's `MultiHeadLatentAttention`
    # with q-LoRA, RoPE, no output gate) has its facts in the wheel.
    attention_kind: str = "mla"

    def __post_init__(self) -> None:
        if self.attention_kind != "mla":
            raise ValueError(
                f"attention_kind {self.attention_kind!r}: only 'mla' is known (FACTS.md says "
                "what a MiniMax-M3 drafter config still lacks)"
            )
        for name in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "intermediate_size",
            "max_position_embeddings",
            "num_speculative_tokens",
            "block_size",
            "tp",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} {value!r}: must be a positive int")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim}: RoPE rotates pairs")
        for name, size in (
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
        ):
            if size % self.tp:
                raise ValueError(f"{name} {size} not divisible by tp {self.tp}")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"hidden_act {self.hidden_act!r}: KimiMLP takes {HIDDEN_ACTS}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps {self.rms_norm_eps}: must be > 0")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta {self.rope_theta}: must be > 0")
        if self.rope_type != "default":
            raise ValueError(
                f"rope_type {self.rope_type!r}: the draft's RoPE is 'default' (no YaRN "
                "scaling, no softmax mscale); another type changes the cos/sin table and scale"
            )
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache_dtype {self.cache_dtype!r}: served are {CACHE_DTYPES}")
        if self.block_size % 16:
            raise ValueError(
                f"block_size {self.block_size}: the stock draft backend (TRITON_MLA) takes "
                "multiples of 16"
            )
        if self.query_len > self.max_position_embeddings:
            raise ValueError(
                f"num_speculative_tokens {self.num_speculative_tokens}: the block does not fit "
                f"max_position_embeddings {self.max_position_embeddings}"
            )

    def with_tp(self, tp: int) -> DrafterConfig:
        return replace(self, tp=tp)

    @property
    def query_len(self) -> int:
        """Query tokens per request in one draft step: the anchor plus N-1 mask tokens
        (`sample_from_anchor`, DSpark's default), else the DFlash layout 1 + N."""
        n = self.num_speculative_tokens
        return n if self.sample_from_anchor else n + 1

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_entry(self) -> int:
        """Elements of one KV cache entry: the normed latent then the roped key part."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def fp8_cache(self) -> bool:
        return self.cache_dtype in ("fp8", "fp8_e4m3")

    @property
    def kv_entry_bytes(self) -> int:
        return self.kv_entry * (1 if self.fp8_cache else 2)

    @property
    def qkv_a_rows(self) -> int:
        """Rows of `fused_qkv_a_proj` (replicated on every rank): q_c | kv_c | k_pe."""
        return self.q_lora_rank + self.kv_entry

    @property
    def softmax_scale(self) -> float:
        """`MultiHeadLatentAttention.scale` for a default RoPE: qk_head_dim ** -0.5."""
        return self.qk_head_dim**-0.5

    @property
    def local_heads(self) -> int:
        return self.num_attention_heads // self.tp

    @property
    def q_b_rows(self) -> int:
        """This rank's `q_b_proj` rows: its heads' [nope | rope] query parts."""
        return self.local_heads * self.qk_head_dim

    @property
    def kv_b_rows(self) -> int:
        """This rank's `kv_b_proj` rows: its heads' [k_nope | v] up-projections."""
        return self.local_heads * (self.qk_nope_head_dim + self.v_head_dim)

    @property
    def o_proj_in(self) -> int:
        """This rank's `o_proj` input columns (RowParallelLinear)."""
        return self.local_heads * self.v_head_dim

    @property
    def local_intermediate(self) -> int:
        """This rank's MLP intermediate columns (gate_up rows are twice this)."""
        return self.intermediate_size // self.tp

    @classmethod
    def tiny(cls, tp: int = 1, cache_dtype: str = "auto") -> DrafterConfig:
        """Same structure, Triton-interpreter sizes: 2 layers, 4 heads, 4 query tokens, KV
        blocks of 16 tokens."""
        return cls(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            intermediate_size=64,
            hidden_act="silu",
            rms_norm_eps=1e-6,
            rope_theta=50000.0,
            max_position_embeddings=4096,
            num_speculative_tokens=4,
            block_size=16,
            tp=tp,
            cache_dtype=cache_dtype,
        )


def k3_dspark(
    *,
    num_attention_heads: int,
    qk_nope_head_dim: int,
    v_head_dim: int,
    intermediate_size: int,
    hidden_act: str,
    rms_norm_eps: float,
    max_position_embeddings: int,
    num_speculative_tokens: int,
    block_size: int,
    tp: int,
    cache_dtype: str = "auto",
    rope_theta: float = 50000.0,
) -> DrafterConfig:
    """The Kimi-K3 DSpark drafter. Fixed here is what the wheel states: 5 layers; a
    2112-row fused_qkv_a_proj of which 576 are KV (q_lora_rank 1536), split 512 latent +
    64 RoPE; hidden 7168 (the draft reads the target's embedding and feeds its LM head).
    The keyword parameters are not in the wheel: they come from the draft checkpoint's
    config.json (`rope_theta` defaults to K3DSparkConfig's 50000 when the checkpoint
    omits it) or from the deployment (`num_speculative_tokens`, `block_size`, `tp`,
    `cache_dtype`)."""
    return DrafterConfig(
        num_hidden_layers=5,
        hidden_size=7168,
        num_attention_heads=num_attention_heads,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=64,
        v_head_dim=v_head_dim,
        intermediate_size=intermediate_size,
        hidden_act=hidden_act,
        rms_norm_eps=rms_norm_eps,
        rope_theta=rope_theta,
        max_position_embeddings=max_position_embeddings,
        num_speculative_tokens=num_speculative_tokens,
        block_size=block_size,
        tp=tp,
        cache_dtype=cache_dtype,
    )
