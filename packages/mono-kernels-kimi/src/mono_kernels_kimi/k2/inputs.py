"""One decode step's K2 inputs at any shape: what the tests, the interpreter runs and the
benchmark feed the kernel and the reference alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KimiK3Config

BF16 = torch.bfloat16


@dataclass
class K2Step:
    cores: list[torch.Tensor]  # per rank [S, Ko] bf16: o_proj's input
    prefix: torch.Tensor  # [S, H] bf16: the AttnRes prefix before this layer's MLP
    blocks: torch.Tensor  # [S, num_attn_res_blocks, H] bf16: the block bank
    live: torch.Tensor  # [S] bool: False on padding rows

    @property
    def slots(self) -> torch.Tensor:
        """int64 [S]: the row's index, -1 on padding rows (the runner's padding mark)."""
        idx = torch.arange(self.live.numel(), device=self.live.device)
        return torch.where(self.live, idx, torch.full_like(idx, -1))


def step_inputs(
    cfg: KimiK3Config,
    rows: int,
    seed: int = 0,
    device: str | torch.device = "cpu",
    padding: tuple[int, ...] = (),
) -> K2Step:
    """Random inputs of `rows` rows for every rank of `cfg.tp`; rows in `padding` are
    padding. The prefix and blocks carry the O(1)-to-O(10) magnitudes a residual stream
    reaches, the cores O(1) (o_proj's weights scale them down)."""
    g = torch.Generator().manual_seed(seed)
    h = cfg.hidden_size

    def randn(*shape, std=1.0):
        return (std * torch.randn(*shape, generator=g)).to(BF16).to(device)

    cores = [randn(rows, cfg.o_proj_in) for _ in range(cfg.tp)]
    prefix = randn(rows, h, std=4.0)
    blocks = randn(rows, cfg.num_attn_res_blocks, h, std=4.0)
    live = torch.ones(rows, dtype=torch.bool)
    live[list(padding)] = False
    return K2Step(cores, prefix, blocks, live.to(device))
