"""The DSpark drafter's plain-torch reference: against an independent float64 transcription
of the equations (one request, token by token, in the un-absorbed multi-head form), its TP
split against TP 1 (shards cut from one set of whole weights), fp32 against fp64, padding,
the fp8 cache, the real config's sizes against what the vLLM wheel states, and the
config's and weights' refusals."""

from __future__ import annotations

import ast
import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.drafter.config import DrafterConfig, k3_dspark
from mono_kernels_kimi.drafter.inputs import DraftStep, step_inputs
from mono_kernels_kimi.drafter.reference import (
    DraftResult,
    context_kv,
    dequantize_fp8,
    drafter_reference,
)
from mono_kernels_kimi.drafter.weights import DrafterWeights, random_weights

pytestmark = pytest.mark.timeout(120)
F64 = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run(cfg, step: DraftStep, weights, **kw) -> DraftResult:
    return drafter_reference(
        cfg,
        step.embeds,
        step.positions,
        step.caches,
        step.block_table,
        step.seq_lens,
        step.slot_mapping,
        weights,
        step.live,
        **kw,
    )


# ---- the independent transcription ---------------------------------------------------


def _norm(x, w, eps, weighted=True):
    y = x / math.sqrt(float((x * x).mean()) + eps)
    return y * w.double() if weighted else y


def _rotate(x, pos, theta, neox=False):
    """RoPE of one vector: pair i turns by pos * theta ** (-2i / d)."""
    d = x.shape[0]
    out = x.clone()
    for i in range(d // 2):
        a, b = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
        angle = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[a], out[b] = x[a] * c - x[b] * s, x[b] * c + x[a] * s
    return out


def _entry(cfg, lw, x, pos, bad):
    """One token's latent KV entry [normed kv_c | roped k_pe] from its normed input x."""
    a = lw.fused_qkv_a_proj.double() @ x
    kv = a[cfg.q_lora_rank : cfg.q_lora_rank + cfg.kv_lora_rank]
    k_pe = a[cfg.q_lora_rank + cfg.kv_lora_rank :]
    kv = _norm(kv, lw.kv_a_layernorm, cfg.rms_norm_eps, bad != "norm")
    return torch.cat((kv, _rotate(k_pe, pos, cfg.rope_theta, bad == "neox")))


def transcribe(cfg, w: DrafterWeights, embeds, positions, context, bad=None):
    """One request's draft block at TP 1 in float64 from the model's equations, token by
    token: per head, keys k = [W_UK kv | k_pe] and values W_UV kv of every context and
    block entry, softmax(q . k / sqrt(qk_head_dim)) over all of them (the block is
    non-causal). `bad` breaks one thing ("causal", "neox", "scale", "norm") so that the
    test shows it would notice. Returns the output rows and the block's entries per
    layer."""
    p, v, lat, eps = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, cfg.rms_norm_eps
    q_len, heads = embeds.shape[0], cfg.num_attention_heads
    dim = cfg.kv_entry if bad == "scale" else cfg.qk_head_dim
    res = [e.double() for e in embeds]
    mlp = [torch.zeros_like(r) for r in res]
    block_entries = []
    for li, lw in enumerate(w.layers):
        res = [r + m for r, m in zip(res, mlp, strict=True)]
        x = [_norm(r, lw.input_layernorm, eps) for r in res]
        new = [_entry(cfg, lw, x[t], int(positions[t]), bad) for t in range(q_len)]
        block_entries.append(torch.stack(new))
        keys = list(context[li].double()) + new
        kv_b = lw.kv_b_proj.double().view(heads, p + v, lat)
        attn = []
        for t in range(q_len):
            a = lw.fused_qkv_a_proj.double() @ x[t]
            q_c = _norm(a[: cfg.q_lora_rank], lw.q_a_layernorm, eps, bad != "norm")
            q = (lw.q_b_proj.double() @ q_c).view(heads, cfg.qk_head_dim)
            outs = []
            for h in range(heads):
                q_pe = _rotate(q[h, p:], int(positions[t]), cfg.rope_theta, bad == "neox")
                seen = keys[: len(keys) - q_len + t + 1] if bad == "causal" else keys
                scores = torch.stack(
                    [(q[h, :p] @ (kv_b[h, :p] @ k[:lat]) + q_pe @ k[lat:]) for k in seen]
                ) / math.sqrt(dim)
                prob = torch.softmax(scores, 0)
                outs.append(
                    sum(pr * (kv_b[h, p:] @ k[:lat]) for pr, k in zip(prob, seen, strict=True))
                )
            attn.append(lw.o_proj.double() @ torch.cat(outs))
        res = [r + o for r, o in zip(res, attn, strict=True)]
        x = [_norm(r, lw.post_attention_layernorm, eps) for r in res]
        d = cfg.intermediate_size
        mlp = []
        for xt in x:
            gu = lw.gate_up_proj.double() @ xt
            g, u = gu[:d], gu[d:]
            act = g * torch.sigmoid(g) if cfg.hidden_act == "silu" else torch.tanh(g) * g.sigmoid()
            mlp.append(lw.down_proj.double() @ (act * u))
    out = [_norm(r + m, w.final_norm, eps) for r, m in zip(res, mlp, strict=True)]
    return torch.stack(out), block_entries


@pytest.fixture(scope="module", params=["silu", "situ"])
def tp1_case(request):
    cfg = replace(DrafterConfig.tiny(1), hidden_act=request.param)
    w = random_weights(cfg, seed=11)
    step = step_inputs(cfg, w, 2, seed=12)
    return cfg, w, step, run(cfg, step, [w], acc=F64)


@pytest.mark.parametrize("req", [0, 1])
def test_reference_matches_the_equations(tp1_case, req):
    cfg, w, step, res = tp1_case
    rows = slice(req * cfg.query_len, (req + 1) * cfg.query_len)
    context = [entries[req] for entries in step.context_entries]
    want, entries = transcribe(cfg, w, step.embeds[rows], step.positions[rows], context)
    # bf16 hand-offs leave ~0.6 % (measured); each broken variant below is >= 6 % off
    assert rel(res.hidden[rows], want) < 1.5e-2
    for layer, cache in enumerate(res.caches):
        got = cache.view(-1, cfg.kv_entry)[step.slot_mapping[rows]]
        assert rel(got, entries[layer]) < 1e-2


@pytest.mark.parametrize("bad", ["causal", "neox", "scale", "norm"])
def test_transcription_notices_a_wrong_mask_rope_scale_or_norm(tp1_case, bad):
    cfg, w, step, res = tp1_case
    rows = slice(0, cfg.query_len)
    context = [entries[0] for entries in step.context_entries]
    wrong, _ = transcribe(cfg, w, step.embeds[rows], step.positions[rows], context, bad)
    assert rel(res.hidden[rows], wrong) > 4e-2


def test_context_kv_matches_the_equations():
    cfg = DrafterConfig.tiny(1)
    layer = random_weights(cfg, seed=13).layers[1]
    states = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(14))
    positions = torch.tensor([0, 1, 17, 33, 40])
    got = context_kv(cfg, layer, states.to(torch.bfloat16), positions, acc=F64)
    want = [
        _entry(cfg, layer, s.double(), int(p), None) for s, p in zip(states, positions, strict=True)
    ]
    assert rel(got, torch.stack(want)) < 1e-2


def test_inputs_page_each_context_over_several_shuffled_blocks():
    cfg = DrafterConfig.tiny(1)
    step = step_inputs(cfg, random_weights(cfg, seed=15), 4, seed=16, padding=(2,))
    bs, q = cfg.block_size, cfg.query_len
    used = []
    for r in range(4):
        n = int(step.seq_lens[r])
        if r == 2:
            assert n == 0 and (step.slot_mapping[2 * q : 3 * q] == -1).all()
            continue
        assert n - q > 2 * bs  # the context spans at least three blocks
        blocks = step.block_table[r, : (n + bs - 1) // bs].tolist()
        assert 0 not in blocks
        used += blocks
        for k in range(q):
            p = int(step.positions[r * q + k])
            assert p == n - q + k
            assert int(step.slot_mapping[r * q + k]) == blocks[p // bs] * bs + p % bs
    assert len(set(used)) == len(used) and used != sorted(used)


# ---- TP, precision, padding, fp8 -------------------------------------------------------


def _shard(whole: DrafterWeights, cfg: DrafterConfig, rank: int) -> DrafterWeights:
    """Rank `rank`'s weights at `cfg.tp` cut from TP-1 weights, as vLLM's loaders cut them:
    q_b / kv_b by heads (rows), o_proj and down_proj by columns, gate_up by the gate and
    up halves; the rest is replicated."""

    def rows(t, n):
        return t[rank * n : (rank + 1) * n].contiguous()

    def cols(t, n):
        return t[:, rank * n : (rank + 1) * n].contiguous()

    n = cfg.local_intermediate
    layers = []
    for lw in whole.layers:
        gate, up = lw.gate_up_proj.chunk(2)
        layers.append(
            replace(
                lw,
                q_b_proj=rows(lw.q_b_proj, cfg.q_b_rows),
                kv_b_proj=rows(lw.kv_b_proj, cfg.kv_b_rows),
                o_proj=cols(lw.o_proj, cfg.o_proj_in),
                gate_up_proj=torch.cat((rows(gate, n), rows(up, n))),
                down_proj=cols(lw.down_proj, n),
            )
        )
    return replace(whole, layers=tuple(layers))


def test_tp_split_matches_tp1():
    cfg = DrafterConfig.tiny(2)
    one = cfg.with_tp(1)
    whole = random_weights(one, seed=21)
    shards = [_shard(whole, cfg, r) for r in range(cfg.tp)]
    for w in shards:
        w.validate(cfg)
    step = step_inputs(cfg, whole, 3, seed=22)
    a = run(one, step, [whole])
    b = run(cfg, step, shards)
    assert rel(b.hidden, a.hidden) < 1e-2
    # Layer 0's latent KV comes from replicated weights alone; later layers' from inputs
    # that went through the TP-split layers before them.
    assert torch.equal(a.caches[0], b.caches[0])
    slots = step.slot_mapping
    for ca, cb in zip(a.caches[1:], b.caches[1:], strict=True):
        assert rel(cb.view(-1, cfg.kv_entry)[slots], ca.view(-1, cfg.kv_entry)[slots]) < 1e-2


def test_fp32_accumulation_is_near_fp64_and_bf16_gemms_near_exact():
    cfg = DrafterConfig.tiny(2)
    ws = [random_weights(cfg, seed=31, rank=r) for r in range(cfg.tp)]
    step = step_inputs(cfg, ws[0], 3, seed=32)
    a = run(cfg, step, ws)
    b = run(cfg, step, ws, acc=F64)
    c = run(cfg, step, ws, exact=False)
    assert rel(a.hidden, b.hidden) < 1e-3
    assert rel(c.hidden, a.hidden) < 1e-2
    assert a.hidden.abs().mean() > 0.1  # the step produces O(1) output


def test_padding_writes_nothing_and_changes_no_live_row():
    cfg = DrafterConfig.tiny(1)
    w = random_weights(cfg, seed=41)
    step = step_inputs(cfg, w, 3, seed=42, padding=(1,))
    step.slot_mapping[2] = -1  # a live token without a slot (a null block) writes nothing
    res = run(cfg, step, [w])
    q = cfg.query_len
    assert (res.hidden[q : 2 * q] == 0).all()
    written = step.slot_mapping[step.slot_mapping >= 0]
    for before, after in zip(step.caches, res.caches, strict=True):
        changed = (before != after).view(-1, cfg.kv_entry).any(-1).nonzero().flatten()
        assert set(changed.tolist()) <= set(written.tolist())
        assert len(changed) > 0
    keep = torch.tensor([0, 2])
    rows = torch.cat((torch.arange(q), torch.arange(2 * q, 3 * q)))
    alone = drafter_reference(
        cfg,
        step.embeds[rows],
        step.positions[rows],
        step.caches,
        step.block_table[keep],
        step.seq_lens[keep],
        step.slot_mapping[rows],
        [w],
    )
    assert torch.equal(alone.hidden, res.hidden[rows])


def test_fp8_cache_stores_scaled_e4m3_and_stays_near_bf16():
    bf, f8 = DrafterConfig.tiny(1), DrafterConfig.tiny(1, cache_dtype="fp8")
    w = random_weights(bf, seed=51)
    a, b = step_inputs(bf, w, 2, seed=52), step_inputs(f8, w, 2, seed=52)
    assert b.caches[0].dtype == torch.uint8 and a.caches[0].dtype == torch.bfloat16
    ra, rb = run(bf, a, [w]), run(f8, b, [w])
    for layer, (ca, cb) in enumerate(zip(ra.caches, rb.caches, strict=True)):
        slots = a.slot_mapping
        scale = w.layers[layer].k_scale
        got = dequantize_fp8(cb.view(-1, f8.kv_entry)[slots], scale)
        assert rel(got, ca.view(-1, bf.kv_entry)[slots]) < 0.07
    assert rel(rb.hidden, ra.hidden) < 0.1


# ---- sizes and refusals ----------------------------------------------------------------


def _wheel_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the installed package, imports nothing
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


K3_CHECKPOINT = dict(  # stand-ins for the values only the draft checkpoint states
    num_attention_heads=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    intermediate_size=18432,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    num_speculative_tokens=7,
    block_size=64,
    tp=8,
)


def test_k3_sizes_are_what_the_wheel_states():
    cfg = k3_dspark(**K3_CHECKPOINT)
    assert cfg.num_hidden_layers == 5
    assert (cfg.kv_entry, cfg.qkv_a_rows) == (576, 2112)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (1536, 512, 64)
    assert cfg.hidden_size == KimiK3Config().hidden_size == 7168  # the target's embedding
    assert cfg.rope_theta == 50000.0 and cfg.query_len == 7
    dspark = _wheel_file("vllm", "models", "kimi_k3", "nvidia", "dspark_mla.py").read_text()
    assert "For K3 this projects\n        # 5*576 rows rather than 5*2112 rows" in dspark
    assert "non_causal_multi_token_decode=True" in dspark
    gemm = _wheel_file("vllm", "models", "kimi_k3", "nvidia", "low_latency_gemm.py")
    assert '(2112, 7168): ProjectionSpec(2112, 7168, _M1_TO_16, name="fused_qkv_a_proj")' in (
        gemm.read_text()
    )
    k3cfg = _wheel_file("vllm", "transformers_utils", "configs", "k3_dspark.py").read_text()
    assert "rope_theta: float = 50000.0" in k3cfg
    assert '"rope_type": "default"' in k3cfg


def test_field_names_are_vllms():
    path = _wheel_file("transformers", "models", "deepseek_v3", "configuration_deepseek_v3.py")
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV3Config")
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    model_fields = {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "intermediate_size",
        "hidden_act",
        "rms_norm_eps",
        "max_position_embeddings",
    }
    assert model_fields <= names


def test_per_rank_sizes():
    cfg = k3_dspark(**K3_CHECKPOINT)
    assert cfg.local_heads == 8
    assert (cfg.q_b_rows, cfg.kv_b_rows, cfg.o_proj_in) == (8 * 192, 8 * 256, 8 * 128)
    assert cfg.local_intermediate == 2304
    assert cfg.softmax_scale == 192**-0.5
    assert cfg.kv_entry_bytes == 1152 and replace(cfg, cache_dtype="fp8").kv_entry_bytes == 576


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(tp=3), "num_attention_heads"),
        (dict(intermediate_size=65), "intermediate_size"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(cache_dtype="fp8_ds_mla"), "cache_dtype"),
        (dict(block_size=24), "block_size"),
        (dict(rope_type="deepseek_yarn"), "rope_type"),
        (dict(attention_kind="gqa"), "attention_kind"),
        (dict(q_lora_rank=0), "q_lora_rank"),
        (dict(qk_rope_head_dim=7), "qk_rope_head_dim"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps"),
        (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    ],
)
def test_config_refuses(change, field):
    with pytest.raises(ValueError, match=field):
        replace(DrafterConfig.tiny(2), **change)


def test_weights_refuse_wrong_shapes():
    cfg = DrafterConfig.tiny(2)
    w = random_weights(cfg, seed=61)
    w.validate(cfg)
    bad = replace(w.layers[1], kv_b_proj=w.layers[1].kv_b_proj[:-1].contiguous())
    with pytest.raises(ValueError, match=r"weights.layers\[1\].kv_b_proj: shape"):
        replace(w, layers=(w.layers[0], bad)).validate(cfg)
    with pytest.raises(ValueError, match="weights.final_norm: dtype"):
        replace(w, final_norm=w.final_norm.float()).validate(cfg)
    with pytest.raises(ValueError, match=r"weights.layers\[0\].q_b_proj"):
        w.validate(cfg.with_tp(1))  # the same model at another TP
    with pytest.raises(ValueError, match="weights.layers: 1 layers"):
        replace(w, layers=w.layers[:1]).validate(cfg)
    q = w.layers[0].q_b_proj
    odd = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # 2 bytes past 16
    odd.copy_(q)
    with pytest.raises(ValueError, match=r"weights.layers\[0\].q_b_proj: address .* 16-byte"):
        replace(w, layers=(replace(w.layers[0], q_b_proj=odd), w.layers[1])).validate(cfg)
