"""The stock Kimi-K3 KDA layer up to o_proj's input, in plain torch: K1's oracle.

Each step follows the vLLM 0.33 function named in its docstring, including where that
path rounds to bf16 (every hand-off between two of its kernels is a bf16 tensor; the
recurrent state stays fp32). The same functions, with `exact=False` (bf16 GEMMs) and
under torch.compile, make the op-by-op baseline of the benchmark.

Slot conventions (vLLM's `KimiK3KDAMetadataBuilder`): a spec-verify step gives
`state_indices` [R, L] (the block-table slice: token t's state goes to column t) and
`num_accepted` [R]; the step starts from column `num_accepted - 1`, and the conv state
lives in column 0's slot. A plain decode gives `state_indices` [R] and no
`num_accepted`. A slot <= 0 (vLLM's null block 0, or -1 of a padded graph row) or past
the cache is padding: nothing is read from or written to it and the row's output is 0.
"""

from __future__ import annotations

import torch

BF16 = torch.bfloat16
L2NORM_EPS = 1e-6  # fused_recurrent_kda_fwd_kernel: x / sqrt(sum(x^2) + 1e-6)


def _linear(x: torch.Tensor, w: torch.Tensor, exact: bool) -> torch.Tensor:
    """y = x w^T rounded to bf16, as a bf16 GEMM with fp32 accumulation leaves it."""
    if exact:
        return (x.float() @ w.float().t()).to(BF16)
    return torch.nn.functional.linear(x, w)


def attn_res(
    prefix: torch.Tensor,
    delta: torch.Tensor | None,
    blocks: torch.Tensor,
    norm_w: torch.Tensor,
    qk_w: torch.Tensor,
    out_norm_w: torch.Tensor,
    num_blocks: int,
    write_idx: int,
    eps: float,
    out_eps: float,
) -> torch.Tensor:
    """The layer's input: AttnRes mix then input RMSNorm, as `_attn_res_kernel` in
    vllm/models/kimi_k3/nvidia/ops/attn_res.py computes it for
    `KimiDecoderLayer._pre_attn_norm`. Updates `prefix` (with `delta`) and `blocks`
    (block `write_idx`) in place; returns x [S, H] bf16."""
    p = prefix.float()
    if delta is not None:
        p = (p + delta.float()).to(prefix.dtype)  # the bf16 prefix-add
        prefix.copy_(p)
        p = p.float()
    if write_idx >= 0:
        blocks[:, write_idx] = p.to(blocks.dtype)
    if num_blocks == 0:
        mixed = p
    else:
        # sources: blocks 0 .. num_blocks - 1, then the prefix
        src = torch.cat([blocks[:, :num_blocks].float(), p[:, None]], dim=1)
        rstd = torch.rsqrt(src.pow(2).mean(-1) + eps)
        logits = (src * (norm_w.float() * qk_w.float())).sum(-1) * rstd
        weights = torch.softmax(logits, dim=-1)
        mixed = (weights[..., None] * src).sum(1)
    x = mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + out_eps)
    return (x * out_norm_w.float()).to(BF16)


def _slots(state_indices: torch.Tensor, num_accepted: torch.Tensor | None, num_slots: int, L: int):
    """(indices [R, L], conv slot [R], first column [R]) in the spec layout."""
    if num_accepted is None:
        idx = state_indices.long().view(-1, 1)
        first = torch.zeros(idx.shape[0], dtype=torch.long, device=idx.device)
    else:
        idx = state_indices.long()[:, :L]
        first = num_accepted.long() - 1
    ok = (idx > 0) & (idx < num_slots)
    return idx, ok, first


def conv_update(
    qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_w: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
    L: int,
) -> torch.Tensor:
    """Short causal conv (width 4) + SiLU over each request's L tokens, updating the conv
    state in place: `_causal_conv1d_update_kernel` (vllm/model_executor/layers/mamba/ops/
    causal_conv1d.py), varlen spec path. `conv_state` is [slots, dim, state_len] (vLLM's
    SD cache transposed, as `KimiK3DeltaAttention._forward` passes it); the window
    starts at entry num_accepted - 1 and the state becomes [window[1:], x_0..x_{L-1}]."""
    S, C = qkv.shape
    R = S // L
    idx, ok, first = _slots(state_indices, num_accepted, conv_state.shape[0], L)
    slot_ok = ok[:, 0]
    slot = torch.where(slot_ok, idx[:, 0], 0)
    old = conv_state[slot]  # [R, C, SL]
    win = first[:, None] + torch.arange(3, device=qkv.device)  # [R, 3]
    hist = torch.gather(old, 2, win[:, None, :].expand(R, C, 3))
    x = qkv.view(R, L, C).transpose(1, 2).to(conv_state.dtype)  # [R, C, L]
    seq = torch.cat([hist, x], dim=2).float()  # [R, C, 3 + L]
    w = conv_w.float()
    acc = sum(w[None, :, j, None] * seq[:, :, j : j + L] for j in range(4))
    out = (acc / (1 + torch.exp(-acc))).to(qkv.dtype)  # SiLU, stored as bf16
    new = old.clone()
    new[:, :, :2] = hist[:, :, 1:]
    new[:, :, 2 : 2 + L] = x
    keep = slot_ok[:, None, None]
    conv_state[slot] = torch.where(keep, new, old)
    return out.transpose(1, 2).reshape(S, C)


def kda_gate(g1: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float):
    """Per-channel log-decay: lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), as
    fused_recurrent_kda_fwd_kernel's USE_GATE_IN_KERNEL + USE_LOWER_BOUND branch."""
    H, D = g1.shape[-2:]
    a = torch.exp(a_log.float())[:, None]
    return lower_bound * torch.sigmoid(a * (g1.float() + dt_bias.float().view(H, D)))


def kda_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g1: torch.Tensor,
    beta_raw: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
) -> torch.Tensor:
    """The gated delta rule token by token on each head's fp32 state [V, K]:
    `fused_recurrent_kda_fwd_kernel` (vllm/models/kimi_k3/nvidia/ops/third_party/kda/
    fused_recurrent.py) as `fused_recurrent_kda` launches it (gate and beta sigmoid in
    kernel, q/k l2-normalised, scale D^-0.5). q, k, v, g1 [R, L, H, D], beta_raw
    [R, L, H]; the state after token t goes to slot state_indices[r, t]. Returns o
    [R, L, H, D] bf16."""
    R, L, H, D = q.shape
    idx, ok, first = _slots(state_indices, num_accepted, state.shape[0], L)
    init = torch.gather(idx, 1, first[:, None])[:, 0]
    live = (init > 0) & (init < state.shape[0])
    s = state[torch.where(live, init, 0)].float()  # [R, H, V, K]
    outs = []
    for t in range(L):
        qt, kt, vt = q[:, t].float(), k[:, t].float(), v[:, t].float()
        qt = qt / torch.sqrt(qt.pow(2).sum(-1, keepdim=True) + L2NORM_EPS) * D**-0.5
        kt = kt / torch.sqrt(kt.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)
        gate = kda_gate(g1[:, t], a_log, dt_bias, lower_bound)
        s = s * torch.exp(gate)[:, :, None, :]
        vt = vt - (s * kt[:, :, None, :]).sum(-1)
        vt = vt * torch.sigmoid(beta_raw[:, t].float())[..., None]
        s = s + vt[..., None] * kt[:, :, None, :]
        outs.append((s * qt[:, :, None, :]).sum(-1))
        write = live & ok[:, t]
        dst = torch.where(write, idx[:, t], 0)
        state[dst] = torch.where(write[:, None, None, None], s, state[dst].float()).to(state.dtype)
    o = torch.stack(outs, dim=1)
    return torch.where(live[:, None, None, None], o, 0.0).to(BF16)


def gated_rmsnorm(o: torch.Tensor, g2: torch.Tensor, weight: torch.Tensor, eps: float):
    """`FusedRMSNormGated(head_dim, activation="sigmoid")` (vllm/third_party/
    flash_linear_attention/ops/kda.py, forward_native): per head,
    rmsnorm(o) * weight * sigmoid(g), rounded to o's dtype."""
    x = o.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (x * torch.sigmoid(g2.float())).to(o.dtype)


def kda_layer(
    cfg,
    *,
    prefix: torch.Tensor,
    delta: torch.Tensor | None,
    blocks: torch.Tensor,
    num_blocks: int,
    write_idx: int,
    w: dict[str, torch.Tensor],
    conv_state: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
    L: int,
    exact: bool = True,
) -> torch.Tensor:
    """One KDA layer from its AttnRes inputs to o_proj's input [S, local_proj] bf16, in
    `KimiDecoderLayer.forward` -> `KimiK3DeltaAttention.forward` / `_forward` order.
    Updates prefix, blocks, conv_state and state in place. `w` holds the layer's
    per-rank weights under the names of `mono_kernels_kimi.kda.inputs.WEIGHTS`."""
    S = prefix.shape[0]
    H, D, P = cfg.local_heads, cfg.kda_head_dim, cfg.local_proj
    x = attn_res(
        prefix,
        delta,
        blocks,
        w["ares_norm"],
        w["ares_qk"],
        w["in_norm"],
        num_blocks,
        write_idx,
        cfg.rms_norm_eps,
        cfg.rms_norm_eps,
    )
    proj = _linear(x, w["in_proj"], exact)
    qkv = proj[:, : 3 * P]
    g2 = proj[:, cfg.g_offset : cfg.g_offset + P]
    f_a = proj[:, cfg.f_a_offset : cfg.f_a_offset + cfg.f_a_dim]
    beta = proj[:, cfg.beta_offset : cfg.beta_offset + H]
    g1 = _linear(f_a, w["f_b"], exact)
    qkv = conv_update(qkv, conv_state, w["conv"], state_indices, num_accepted, L)
    R = S // L
    q, k, v = (t.reshape(R, L, H, D) for t in qkv.split(P, dim=-1))
    o = kda_recurrence(
        q,
        k,
        v,
        g1.reshape(R, L, H, D),
        beta.reshape(R, L, H),
        w["a_log"],
        w["dt_bias"],
        cfg.gate_lower_bound,
        state,
        state_indices,
        num_accepted,
    )
    core = gated_rmsnorm(o.reshape(S, H, D), g2.reshape(S, H, D), w["o_norm"], cfg.o_norm_eps)
    return core.reshape(S, P)
