"""MiniMax-M3 sizes and constants the kernels are specialised for.

The values follow vLLM 0.33's `MiniMaxM3TextConfig` defaults
(vllm/transformers_utils/configs/minimax_m3.py), which mirror the MiniMax-M3-preview
checkpoint. `tiny()` keeps every structural property (top-k, shared expert, Gemma norm,
SwiGLU-OAI constants, block-32 MXFP4 groups) at sizes a CPU interpreter runs in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MiniMaxM3Config:
    hidden_size: int = 6144
    num_hidden_layers: int = 60
    first_dense_layers: int = 3  # moe_layer_freq = [0] * 3 + [1] * 57
    num_experts: int = 128  # num_local_experts
    top_k: int = 4  # num_experts_per_tok
    moe_intermediate_size: int = 3072  # intermediate_size (one routed expert, all ranks)
    n_shared_experts: int = 1  # shared MLP width = moe_intermediate_size * n_shared_experts
    dense_intermediate_size: int = 12288
    routed_scaling_factor: float = 2.0
    swiglu_alpha: float = 1.702
    swiglu_beta: float = 1.0  # the (up + 1) bias; the checkpoint omits it, vLLM defaults 1.0
    swiglu_limit: float = 7.0
    rms_norm_eps: float = 1e-6
    max_rows: int = 16  # widest decode step the kernels serve (S = 1..16)

    @property
    def shared_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.n_shared_experts

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_dense_layers

    def per_rank_intermediate(self, tp: int) -> int:
        """A routed expert's intermediate columns on one TP rank (768 at TP4)."""
        return self._split(self.moe_intermediate_size, tp, "moe_intermediate_size")

    def per_rank_shared_intermediate(self, tp: int) -> int:
        return self._split(self.shared_intermediate_size, tp, "shared_intermediate_size")

    @staticmethod
    def _split(size: int, tp: int, what: str) -> int:
        if tp < 1 or size % tp or (size // tp) % 32:
            raise ValueError(f"tp={tp}: {what}={size} does not split into block-32 shards")
        return size // tp

    @classmethod
    def tiny(cls) -> MiniMaxM3Config:
        """Same structure, CPU-interpreter sizes: 256 hidden, 16 experts, 128 intermediate
        (32 per rank at TP4: one MXFP4 block)."""
        return replace(
            cls(),
            hidden_size=256,
            num_hidden_layers=4,
            first_dense_layers=1,
            num_experts=16,
            moe_intermediate_size=128,
            dense_intermediate_size=512,
        )
