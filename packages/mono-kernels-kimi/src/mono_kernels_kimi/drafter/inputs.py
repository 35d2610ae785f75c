"""One draft step's inputs at any shape: what the tests, the interpreter runs and the
benchmark feed the drafter kernels and the reference alike."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DrafterConfig
from .reference import cache_slots, context_kv, to_cache
from .weights import DrafterWeights

BF16 = torch.bfloat16


@dataclass
class DraftStep:
    embeds: torch.Tensor  # [T, H] bf16: the block's token embeddings, request-major
    positions: torch.Tensor  # [T] int64 (0 on padding requests)
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot of each token, -1 on padding
    block_table: torch.Tensor  # [R, max_blocks] int32: physical KV blocks, 0 = null block
    seq_lens: torch.Tensor  # [R] int32: context + block (0 on padding requests)
    caches: list[torch.Tensor]  # per layer [blocks, block_size, entry]: context written
    live: torch.Tensor  # [R] bool: False on padding requests
    # [layer][request] [context_len, entry]: the context entries as stored, position order
    context_entries: list[list[torch.Tensor]]


def step_inputs(
    cfg: DrafterConfig,
    weights: DrafterWeights,
    requests: int,
    seed: int = 0,
    padding: tuple[int, ...] = (),
    context_lens: tuple[int, ...] | None = None,
    device: str | torch.device = "cpu",
) -> DraftStep:
    """Random inputs of `requests` requests; those in `padding` are padding slots. Each
    live request's context (default: 2 to 4 KV blocks long, so its block straddles block
    boundaries) is written into every layer's cache by the stock context precompute
    (`context_kv` of random context states with `weights`, any rank's); its physical
    blocks are shuffled over the cache, and every slot no request owns holds large
    garbage, so that a wrong slot or a missing mask shows."""
    g = torch.Generator().manual_seed(seed)
    q_len, bs, h = cfg.query_len, cfg.block_size, cfg.hidden_size
    live = torch.ones(requests, dtype=torch.bool)
    live[list(padding)] = False
    if context_lens is None:
        context_lens = tuple(
            int(n) for n in torch.randint(2 * bs + 1, 4 * bs, (requests,), generator=g)
        )
    seq_lens = torch.tensor(
        [n + q_len if ok else 0 for n, ok in zip(context_lens, live.tolist(), strict=True)],
        dtype=torch.int32,
    )
    blocks_per_req = [(int(n) + bs - 1) // bs for n in seq_lens]
    num_blocks = 1 + sum(blocks_per_req) + 2  # the null block 0 and two never used
    order = (1 + torch.randperm(num_blocks - 1, generator=g)).tolist()
    block_table = torch.zeros(requests, max(max(blocks_per_req), 1), dtype=torch.int32)
    for i, nb in enumerate(blocks_per_req):
        block_table[i, :nb] = torch.tensor(order[:nb], dtype=torch.int32)
        order = order[nb:]

    positions = torch.zeros(requests * q_len, dtype=torch.int64)
    slot_mapping = torch.full((requests * q_len,), -1, dtype=torch.int64)
    for i in live.nonzero().flatten().tolist():
        ctx = context_lens[i]
        rows = slice(i * q_len, (i + 1) * q_len)
        positions[rows] = torch.arange(ctx, ctx + q_len)
        slot_mapping[rows] = cache_slots(block_table, i, ctx + q_len, bs)[ctx:]
    embeds = torch.randn(requests * q_len, h, generator=g).to(BF16)

    caches, context_entries = [], []
    for layer in weights.layers:
        garbage = 8.0 * torch.randn(num_blocks, bs, cfg.kv_entry, generator=g)
        cache = to_cache(garbage, cfg, layer.k_scale)
        flat = cache.view(-1, cfg.kv_entry)
        per_req = []
        for i, ctx in enumerate(context_lens):
            n = ctx if live[i] else 0
            states = torch.randn(n, h, generator=g).to(BF16)
            entries = to_cache(context_kv(cfg, layer, states, torch.arange(n)), cfg, layer.k_scale)
            flat[cache_slots(block_table, i, n, bs)] = entries
            per_req.append(entries)
        caches.append(cache.to(device))
        context_entries.append([e.to(device) for e in per_req])
    return DraftStep(
        embeds=embeds.to(device),
        positions=positions.to(device),
        slot_mapping=slot_mapping.to(device),
        block_table=block_table.to(device),
        seq_lens=seq_lens.to(device),
        caches=caches,
        live=live.to(device),
        context_entries=context_entries,
    )
