"""The plain-torch reference against a float64 transcription of the KDA layer's equations.

The transcription is written from the equations, not from the reference: the delta rule
in its matrix form S_t = S_{t-1} Diag(a_t) (I - b_t k_t k_t^T) + b_t v_t k_t^T, o_t = S_t q_t,
one token and one request at a time, with no bf16 rounding in between. A wrong gate
sign, a missing normalisation or a wrong slot shows up far above the tolerances, which
only have to absorb the reference's bf16 hand-offs.
"""

from __future__ import annotations

import math

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.inputs import make_inputs

F64 = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def transcription(inp):
    """Returns (core [S, P], {slot: state [H, V, K]}, {slot: conv state [C, SL]})."""
    cfg, R, L = inp.cfg, inp.R, inp.L
    H, D, P = cfg.local_heads, cfg.kda_head_dim, cfg.local_proj
    w = {k: v.to(F64) for k, v in inp.weights.items()}
    eps = cfg.rms_norm_eps
    core = torch.zeros(R * L, P, dtype=F64)
    states, convs = {}, {}
    idx = inp.state_indices.view(R, -1).long()
    acc = inp.num_accepted.long() if inp.num_accepted is not None else torch.ones(R).long()
    nslots = inp.state.shape[0]
    for r in range(R):
        first = int(acc[r]) - 1
        conv_slot, init_slot = int(idx[r, 0]), int(idx[r, first])
        if not 0 < init_slot < nslots:
            continue  # padding: output 0, nothing written
        hist = inp.conv_state[conv_slot].to(F64)[:, first : first + 3].clone()  # [C, 3]
        S = inp.state[init_slot].to(F64).clone()  # [H, V, K]
        xs = []
        for t in range(L):
            s = r * L + t
            p = inp.prefix[s].to(F64) + (inp.delta[s].to(F64) if inp.delta is not None else 0)
            sources = [inp.blocks[s, j].to(F64) for j in range(inp.num_blocks)] + [p]
            logits = [
                (v * w["ares_norm"] * w["ares_qk"]).sum() / torch.sqrt(v.pow(2).mean() + eps)
                for v in sources
            ]
            m = max(float(z) for z in logits)
            e = [math.exp(float(z) - m) for z in logits]
            mixed = sum(ei * v for ei, v in zip(e, sources, strict=True)) / sum(e)
            x = mixed / torch.sqrt(mixed.pow(2).mean() + eps) * w["in_norm"]
            proj = w["in_proj"] @ x
            u = proj[: 3 * P]
            g2 = proj[cfg.g_offset : cfg.g_offset + P].view(H, D)
            f_a = proj[cfg.f_a_offset : cfg.f_a_offset + cfg.f_a_dim]
            beta = torch.sigmoid(proj[cfg.beta_offset : cfg.beta_offset + H])
            g1 = (w["f_b"] @ f_a).view(H, D)
            window = torch.cat([hist, u[:, None]], dim=1)  # [C, 4]: oldest first
            y = (window * w["conv"]).sum(1)
            y = y * torch.sigmoid(y)
            hist = window[:, 1:]
            q, k, v = (z.view(H, D) for z in y.split(P))
            decay = torch.exp(
                cfg.gate_lower_bound
                * torch.sigmoid(torch.exp(w["a_log"])[:, None] * (g1 + w["dt_bias"].view(H, D)))
            )
            for h in range(H):
                qh = q[h] / torch.sqrt(q[h].pow(2).sum() + 1e-6) / math.sqrt(D)
                kh = k[h] / torch.sqrt(k[h].pow(2).sum() + 1e-6)
                eye = torch.eye(D, dtype=F64)
                S[h] = S[h] @ torch.diag(decay[h]) @ (eye - beta[h] * torch.outer(kh, kh)) + beta[
                    h
                ] * torch.outer(v[h], kh)
                o = S[h] @ qh
                o = o / torch.sqrt(o.pow(2).mean() + cfg.o_norm_eps) * w["o_norm"]
                core[s, h * D : (h + 1) * D] = o * torch.sigmoid(g2[h])
            slot = int(idx[r, t])
            if 0 < slot < nslots:
                states[slot] = S.clone()
            xs.append(u)
        if 0 < conv_slot < nslots:
            old = inp.conv_state[conv_slot].to(F64)
            new = old.clone()
            new[:, :2] = old[:, first + 1 : first + 3]
            new[:, 2 : 2 + L] = torch.stack(xs, dim=1)
            convs[conv_slot] = new
    return core, states, convs


CASES = [(1, 1, False), (3, 1, True), (1, 4, True), (2, 3, True)]


@pytest.mark.parametrize("R,L,spec", CASES)
@pytest.mark.parametrize("layer_idx", [0, 3, 4])
def test_reference_matches_equations(R, L, spec, layer_idx):
    cfg = KimiK3Config.tiny()
    inp = make_inputs(
        cfg,
        R,
        L,
        spec=spec,
        layer_idx=layer_idx,
        delta=layer_idx > 0,
        pad=(R - 1,) if R > 1 else (),
        seed=R * 10 + L + layer_idx,
    )
    want_core, want_states, want_convs = transcription(inp)
    got = inp.clone()
    core = got.reference()
    assert rel(core, want_core) < 2e-2
    for slot, st in want_states.items():
        assert rel(got.state[slot], st) < 1e-2, slot
    for slot, cs in want_convs.items():
        assert rel(got.conv_state[slot], cs) < 1e-2, slot
    # every slot nobody owns is untouched, padded requests output zeros
    owned = set(want_states) | set(want_convs)
    for slot in range(inp.state.shape[0]):
        if slot not in owned:
            assert torch.equal(got.state[slot], inp.state[slot])
            assert torch.equal(got.conv_state[slot], inp.conv_state[slot])
    if R > 1:
        assert torch.all(core[(R - 1) * L :] == 0)


def test_equations_catch_a_wrong_gate_sign(monkeypatch):
    """The check above is not vacuous: a reference whose decay has the wrong sign (a
    growing state) lands far outside its tolerance."""
    from mono_kernels_kimi.kda import reference

    cfg = KimiK3Config.tiny()
    inp = make_inputs(cfg, 1, 4, seed=7)
    want_core, want_states, _ = transcription(inp)
    gate = reference.kda_gate
    monkeypatch.setattr(reference, "kda_gate", lambda *a: -gate(*a))
    bad = inp.clone()
    core = bad.reference()
    assert rel(core, want_core) > 5e-2 or any(
        rel(bad.state[s], st) > 5e-2 for s, st in want_states.items()
    )
