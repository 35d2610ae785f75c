"""One DSpark draft step of the Kimi-K3 drafter in plain torch: the drafter kernels' oracle
and, with ``exact=False`` on a GPU, an op-by-op baseline.

The draft step runs every request's block of `cfg.query_len` query tokens (the anchor and
N-1 mask tokens; their embeddings are the input) through the draft layers and the final
norm. Each step follows the vLLM 0.33 code named here (K3DSparkModel and its layers in
vllm/models/kimi_k3/nvidia/dspark_mla.py, `MultiHeadLatentAttention` in mla.py, `KimiMLP`
in model.py, the TRITON_MLA backend the draft runs on), including where the stock path
rounds to bf16 (every hand-off between two of its kernels):

    input norm  `K3DSparkDecoderLayer.forward`: layer 0 normalizes the embeddings (the
                residual); later layers `fused_allreduce_rms_norm` (the MLP partials
                summed over ranks -> bf16, plus the residual in fp32 -> the new bf16
                residual, normalized from the fp32 sum)
    qkv_a       `fused_qkv_a_proj` (replicated) -> q_c | kv_c | k_pe, bf16
    q/kv norms  `fused_q_kv_rmsnorm`: fp32 x * rrms * w, one rounding
    q_b         `q_b_proj` -> [nope | rope] per local head, bf16
    absorb      `_attention`: q_nope @ W_UK_T (bmm) -> bf16
    rope        the fused decode epilogue: GPT-J (interleaved) RoPE of q_pe and k_pe from
                the fp32 cos/sin table, in fp32 -> bf16
    cache       the same epilogue writes [kv_c_normed | k_pe] at the token's slot (bf16,
                or fp8 e4m3 of x / k_scale; the query then goes through fp8 with q_scale
                and back to bf16, as for TRITON_MLA)
    attention   `TritonMLAImpl.forward_mqa`, non-causal: every query row of a request
                reads the request's cache positions 0 .. seq_len - 1 (context and the
                whole block); logits in fp32 times qk_head_dim ** -0.5, softmax, values
                are the latent part of the entries -> bf16
    v up        `_v_up_proj`: latent @ W_UV (bmm) -> bf16
    o_proj      RowParallelLinear, reduce_results False: each rank's bf16 partial
    post norm   `fused_allreduce_rms_norm` with post_attention_layernorm
    MLP         `KimiMLP`: gate_up (bf16), SiluAndMul / SituAndMul in fp32 -> bf16,
                down_proj: each rank's bf16 partial, reduced by the next norm
    final norm  `fused_allreduce_rms_norm` with `final_norm`: the output

Padding requests (`live` False) write nothing and their rows are 0. A live token whose slot
is negative (vLLM's PAD_SLOT_ID for a null block) writes nothing either.

`acc` is the dtype of every float step (fp32 as the kernels; fp64 shows how far fp32
itself is from the exact math). The ranks' partials are summed in rank order in `acc`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..k2.reference import linear, rank_ordered_sum, rms_norm, situ
from .config import DrafterConfig
from .weights import DrafterLayerWeights, DrafterWeights

BF16, F32 = torch.bfloat16, torch.float32
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value; the cache insert saturates to it


@dataclass
class DraftResult:
    hidden: torch.Tensor  # [T, H] bf16: the final-normed hidden states, 0 on padding rows
    caches: list[torch.Tensor]  # per layer [blocks, block_size, entry]: after the writes


@functools.lru_cache(maxsize=4)
def cos_sin_cache(cfg: DrafterConfig) -> torch.Tensor:
    """[max_position_embeddings, R] fp32: cos then sin of position x inv_freq, as
    `RotaryEmbedding._compute_cos_sin_cache` builds the default RoPE's table in fp32
    (cached: a real config's table is 64 MiB; callers must not modify it)."""
    r = cfg.qk_rope_head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=F32) / r))
    t = torch.arange(cfg.max_position_embeddings, dtype=F32)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def rope(x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, acc: torch.dtype):
    """GPT-J RoPE (`is_neox_style=False`) of x [T, ..., R] at `positions` [T]: pairs
    (2i, 2i+1) rotated by angle i, computed in `acc`, rounded to bf16."""
    cos, sin = table[positions].to(acc).chunk(2, dim=-1)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.view(shape), sin.view(shape)
    xf = x.to(acc)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).to(BF16)


def rms_norm_once(x: torch.Tensor, w: torch.Tensor, eps: float, acc: torch.dtype):
    """`fused_q_kv_rmsnorm` (vllm/models/common/ops/fused_qk_rmsnorm.py): x * rrms * w in
    float, rounded once to bf16."""
    xf = x.to(acc)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.to(acc)).to(BF16)


def add_rms_norm(
    parts: Sequence[torch.Tensor],
    residual: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    acc: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_allreduce_rms_norm`: the ranks' bf16 partials summed in rank order (the
    all-reduce's bf16 result), plus the residual in float (`ir.ops.fused_add_rms_norm`):
    the sum rounded is the new residual, the sum normalized (`rms_norm`) the output."""
    total = rank_ordered_sum(parts, acc).to(BF16).to(acc) + residual.to(acc)
    return rms_norm(total, w, eps, acc), total.to(BF16)


def bmm(x: torch.Tensor, w: torch.Tensor, acc: torch.dtype, exact: bool) -> torch.Tensor:
    """Per-head x [T, n, K] @ w [n, K, N] -> [T, n, N] rounded to bf16, as the stock
    `torch.bmm` in bf16 leaves it (`exact`: accumulated in `acc`)."""
    if exact:
        return torch.einsum("tnk,nkm->tnm", x.to(acc), w.to(acc)).to(BF16)
    return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)


def act_and_mul(cfg: DrafterConfig, gate_up: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """`KimiMLP.act_fn` on the [gate | up] halves in `acc`, rounded to bf16: SiluAndMul, or
    SituAndMul as the draft layer builds it (beta 1.0, no linear_beta: up is not clipped)."""
    if cfg.hidden_act == "situ":
        return situ(gate_up.to(acc), 1.0).to(BF16)
    d = gate_up.shape[-1] // 2
    g, u = gate_up[..., :d].to(acc), gate_up[..., d:].to(acc)
    return (g * torch.sigmoid(g) * u).to(BF16)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The e4m3 bytes (uint8, the engine's fp8 cache dtype) of x / scale, saturated."""
    q = (x.float() * (1.0 / scale.float())).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8).view(torch.uint8)


def dequantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes times scale in fp32, rounded to bf16, as `_fwd_grouped_kernel_stage1`
    dequantizes the cache it reads."""
    return (x.view(FP8).float() * scale.float()).to(BF16)


def to_cache(x: torch.Tensor, cfg: DrafterConfig, scale: torch.Tensor) -> torch.Tensor:
    """bf16 entries as the cache stores them (bf16, or fp8 bytes of x / scale)."""
    return quantize_fp8(x, scale) if cfg.fp8_cache else x.to(BF16)


def from_cache(x: torch.Tensor, cfg: DrafterConfig, scale: torch.Tensor) -> torch.Tensor:
    """Stored entries as the attention reads them: bf16."""
    return dequantize_fp8(x, scale) if cfg.fp8_cache else x


def cache_slots(block_table: torch.Tensor, req: int, n: int, block_size: int) -> torch.Tensor:
    """Flat cache slots [n] of request `req`'s positions 0 .. n - 1 (paged: the block
    table's entry position // block_size, then the offset in the block)."""
    pos = torch.arange(n, device=block_table.device)
    return block_table[req, pos // block_size].long() * block_size + pos % block_size


def attention(q: torch.Tensor, keys: torch.Tensor, cfg: DrafterConfig, acc: torch.dtype):
    """Latent MQA of one request: q [Q, n, L + R] over entries [S, L + R], every query row
    over every entry (non-causal), values the entries' first L; -> [Q, n, L] bf16."""
    logits = torch.einsum("qhe,se->qhs", q.to(acc), keys.to(acc)) * cfg.softmax_scale
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("qhs,sl->qhl", p, keys[:, : cfg.kv_lora_rank].to(acc)).to(BF16)


def context_kv(
    cfg: DrafterConfig,
    layer: DrafterLayerWeights,
    context: torch.Tensor,
    positions: torch.Tensor,
    acc: torch.dtype = F32,
    exact: bool = True,
) -> torch.Tensor:
    """The bf16 cache entries [T, L + R] one layer stores for context tokens, before the
    cache's fp8 conversion: `K3DSparkModel._precompute_fused_context_kv` runs the layer's
    kv_a rows (`context_kv_proj`) over `context` (the target hidden states after
    `context_proj` and `context_norm`), normalizes the latent with kv_a_layernorm
    (`ops.rms_norm`) and ropes k_pe at the context positions."""
    kv = linear(context, layer.fused_qkv_a_proj[cfg.q_lora_rank :], acc, exact)
    kv_c, k_pe = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
    kv_c = rms_norm(kv_c, layer.kv_a_layernorm, cfg.rms_norm_eps, acc)
    table = cos_sin_cache(cfg).to(context.device)
    return torch.cat((kv_c, rope(k_pe, positions, table, acc)), dim=-1)


def _attention_partial(
    cfg: DrafterConfig,
    x: torch.Tensor,
    positions: torch.Tensor,
    caches: list[torch.Tensor],
    layer_idx: int,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    weights: Sequence[DrafterWeights],
    table: torch.Tensor,
    acc: torch.dtype,
    exact: bool,
) -> list[torch.Tensor]:
    """One layer's MLA over the live rows `x` [T, H] (normed): writes the layer's cache
    entries, returns each rank's unreduced o_proj output [T, H] bf16."""
    w0 = weights[0].layers[layer_idx]  # the replicated tensors are alike on every rank
    qkv = linear(x, w0.fused_qkv_a_proj, acc, exact)
    q_c, kv_c, k_pe = qkv.split([cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim], -1)
    q_c = rms_norm_once(q_c, w0.q_a_layernorm, cfg.rms_norm_eps, acc)
    kv_c = rms_norm_once(kv_c, w0.kv_a_layernorm, cfg.rms_norm_eps, acc)
    entry = torch.cat((kv_c, rope(k_pe, positions, table, acc)), dim=-1)
    flat = caches[layer_idx].view(-1, cfg.kv_entry)
    writes = slot_mapping >= 0
    flat[slot_mapping[writes]] = to_cache(entry[writes], cfg, w0.k_scale)

    q_len = cfg.query_len
    parts = []
    for w in weights:
        lw = w.layers[layer_idx]
        q = linear(q_c, lw.q_b_proj, acc, exact).view(-1, cfg.local_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        mqa_q = torch.cat(
            (bmm(q_nope, lw.w_uk(cfg), acc, exact), rope(q_pe, positions, table, acc)), -1
        )
        if cfg.fp8_cache:
            # `_decode_concat_cache` quantizes the query for an fp8 cache; TRITON_MLA takes
            # a bf16 query, so the stock path dequantizes it again.
            mqa_q = dequantize_fp8(quantize_fp8(mqa_q, lw.q_scale), lw.q_scale)
        latent = torch.empty(mqa_q.shape[:2] + (cfg.kv_lora_rank,), dtype=BF16, device=mqa_q.device)
        for i in range(mqa_q.shape[0] // q_len):
            rows = slice(i * q_len, (i + 1) * q_len)
            slots = cache_slots(block_table, i, int(seq_lens[i]), cfg.block_size)
            keys = from_cache(flat[slots], cfg, lw.k_scale)
            latent[rows] = attention(mqa_q[rows], keys, cfg, acc)
        v = bmm(latent, lw.w_uv(cfg), acc, exact).flatten(1)
        parts.append(linear(v, lw.o_proj, acc, exact))
    return parts


def drafter_reference(
    cfg: DrafterConfig,
    embeds: torch.Tensor,
    positions: torch.Tensor,
    caches: Sequence[torch.Tensor],
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    weights: Sequence[DrafterWeights],
    live: torch.Tensor | None = None,
    acc: torch.dtype = F32,
    exact: bool = True,
) -> DraftResult:
    """The draft step over every rank: `embeds` [T, H] bf16 (T = requests x query_len,
    request-major: the block's token embeddings), `positions` and `slot_mapping` [T],
    `caches` one [blocks, block_size, entry] per layer (alike on every rank: the latent
    KV is replicated), `block_table` [R, max_blocks], `seq_lens` [R] (context + block),
    `weights[r]` rank r's. Nothing passed in is modified; the result holds new caches."""
    if len(weights) != cfg.tp:
        raise ValueError(f"weights: {len(weights)} ranks, expected tp {cfg.tp}")
    q_len, reqs = cfg.query_len, block_table.shape[0]
    if embeds.shape[0] != reqs * q_len:
        raise ValueError(f"embeds: {embeds.shape[0]} rows, expected {reqs} x {q_len}")
    device = embeds.device
    live = torch.ones(reqs, dtype=torch.bool, device=device) if live is None else live.to(device)
    rows = live.repeat_interleave(q_len)
    idx = live.nonzero().flatten()
    new_caches = [c.clone() for c in caches]
    table = cos_sin_cache(cfg).to(device)
    pos = positions[rows]
    live_slots = slot_mapping[rows]
    live_table, live_lens = block_table[idx], seq_lens[idx]

    residual = embeds[rows]
    x = rms_norm(residual, weights[0].layers[0].input_layernorm, cfg.rms_norm_eps, acc)
    mlp: list[torch.Tensor] = []  # the previous layer's MLP partials, reduced by the next norm
    for i in range(cfg.num_hidden_layers):
        if i > 0:
            x, residual = add_rms_norm(
                mlp, residual, weights[0].layers[i].input_layernorm, cfg.rms_norm_eps, acc
            )
        parts = _attention_partial(
            cfg,
            x,
            pos,
            new_caches,
            i,
            live_table,
            live_lens,
            live_slots,
            weights,
            table,
            acc,
            exact,
        )
        x, residual = add_rms_norm(
            parts, residual, weights[0].layers[i].post_attention_layernorm, cfg.rms_norm_eps, acc
        )
        mlp = []
        for w in weights:
            gate_up = linear(x, w.layers[i].gate_up_proj, acc, exact)
            mlp.append(linear(act_and_mul(cfg, gate_up, acc), w.layers[i].down_proj, acc, exact))
    out, _ = add_rms_norm(mlp, residual, weights[0].final_norm, cfg.rms_norm_eps, acc)
    hidden = torch.zeros(embeds.shape, dtype=BF16, device=device)
    hidden[rows] = out
    return DraftResult(hidden=hidden, caches=new_caches)
