"""mono's DSpark drafter in vLLM (`mono_vllm.drafter`, `mono_vllm.models.dspark`): what it
reads of vLLM 0.33's draft model classes exists (the attributes in test_vllm_contract.py,
the scales and weights registered by vLLM's helpers here), the config and weights it reads are the
loaded model's field by field, each batch the kernels do not take runs vLLM's layers, and
end to end (a child under the Triton interpreter) a draft forward through the glue is the
reference's draft step, with the runner kept, rebuilt on a re-bind, and closed."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("vllm")

from mono_kernels_kimi.drafter.config import DrafterConfig  # noqa: E402
from mono_kernels_kimi.drafter.weights import random_weights  # noqa: E402
from mono_peer.testing import spawn  # noqa: E402
from mono_vllm.drafter import draft_batch, draft_config, draft_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drafter_plugin_child as child  # noqa: E402


def test_the_scales_and_weights_it_reads_are_registered_by_vllms_helpers():
    """`_k_scale` / `_q_scale` and a linear layer's `weight` are registered by helpers that
    take the layer as an argument (not on ``self``): read from those helpers."""
    from vllm.model_executor.layers.attention import attention
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.models.kimi_k3.nvidia.mla import MultiHeadLatentAttention

    assert "_init_kv_cache_quant(self" in inspect.getsource(MultiHeadLatentAttention.__init__)
    helper = inspect.getsource(attention._init_kv_cache_quant)
    assert "set_default_quant_scales(layer, register_buffer=True)" in helper
    defaults = inspect.getsource(attention.set_default_quant_scales)
    assert all(f'register_buffer("{name}"' in defaults for name in ("_k_scale", "_q_scale"))
    created = inspect.getsource(UnquantizedLinearMethod.create_weights)
    assert 'register_parameter("weight"' in created


def test_the_vllm_calls_the_child_stands_in_for_exist():
    for module, name in child.VLLM_CALLS:
        assert callable(getattr(importlib.import_module(module), name)), (module, name)


def _real_hf(**extra):
    from vllm.transformers_utils.configs.k3_dspark import K3DSparkConfig

    c = DrafterConfig.tiny()
    return K3DSparkConfig(
        hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
        q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
        qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim, intermediate_size=c.intermediate_size,
        hidden_act=c.hidden_act, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, num_hidden_layers=2,
        target_layer_ids=[1, 3], num_target_layers=2, **extra,
    )  # fmt: skip


def _deployment(hf, tokens=4, block=16):
    return NS(
        speculative_config=NS(draft_model_config=NS(hf_config=hf), num_speculative_tokens=tokens),
        cache_config=NS(block_size=block),
    )


def _backbone(layers=2, dtype="auto", gate=False, cache=None):
    """vLLM's MLA holds an empty kv_cache until one is bound."""
    cache = torch.tensor([]) if cache is None else cache
    attn = NS(kv_cache_dtype=dtype, use_output_gate=gate, kv_cache=cache)
    return NS(layers=[NS(self_attn=attn)] * layers)


def test_the_config_is_the_loaded_draft_models():
    """vLLM's own K3DSparkConfig (its rope_theta default 50000 included) maps onto the
    tiny DrafterConfig field by field; the deployment's TP, tokens and cache dtype too."""
    got = draft_config(_deployment(_real_hf()), _backbone(), 1)
    assert got == DrafterConfig.tiny()
    assert draft_config(_deployment(_real_hf()), _backbone(dtype="fp8"), 2) == (
        DrafterConfig.tiny(2, "fp8")
    )
    # the bound cache's block (the backend's kernel blocks), not the configured one
    split = _backbone(cache=torch.zeros(8, 1, 32, 40, dtype=torch.bfloat16))
    assert draft_config(_deployment(_real_hf()), split, 1).block_size == 32
    hf = _real_hf()
    hf.sample_from_anchor = False  # a speculators-format checkpoint: 1 + N rows a request
    assert draft_config(_deployment(hf, tokens=3), _backbone(), 1).query_len == 4


def test_a_draft_model_the_kernels_do_not_take_is_named():
    with pytest.raises(ValueError, match="output gate"):
        draft_config(_deployment(_real_hf()), _backbone(gate=True), 1)
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        draft_config(_deployment(_real_hf()), _backbone(dtype="fp8_ds_mla"), 1)
    with pytest.raises(ValueError, match="num_attention_heads 4 not divisible by tp 3"):
        draft_config(_deployment(_real_hf()), _backbone(), 3)


def test_the_weights_are_vllms_tensors_in_place():
    cfg = DrafterConfig.tiny()
    w = random_weights(cfg, seed=1)
    caches = [torch.zeros(4, cfg.block_size, cfg.kv_entry, dtype=torch.bfloat16)] * 2
    model = child.standin_model(cfg, w, caches, None, None)
    got = draft_weights(model.model)
    got.validate(cfg)
    for mine, theirs in zip(got.layers, w.layers, strict=True):
        for name, t in theirs.tensors().items():
            assert mine.tensors()[name].data_ptr() == t.data_ptr(), name
    assert got.layers[0].k_scale.shape == () and got.final_norm is w.final_norm
    del model.model.layers[0].self_attn._q_scale  # none loaded: vLLM's default 1.0
    assert draft_weights(model.model).layers[0].q_scale.item() == 1.0


def _metadata(rows=8, reqs=4, **kw):
    """Uniform decode metadata of `rows` rows; its per-request buffers hold `reqs` rows
    (vLLM's may hold more than the batch's)."""
    decode = NS(
        block_table=torch.zeros(reqs, 4, dtype=torch.int32),
        seq_lens=torch.ones(reqs, dtype=torch.int32),
    )
    md = NS(decode=decode, num_prefills=0, num_decode_tokens=rows)
    for k, v in kw.items():
        setattr(md, k, v)
    return md


def _context(md, slots=None, names=("a", "b")):
    slots = torch.zeros(16, dtype=torch.int64) if slots is None else slots
    return NS(attn_metadata=dict.fromkeys(names, md), slot_mapping=dict.fromkeys(names, slots))


def test_a_uniform_draft_batch_is_read_from_the_forward_context():
    table, seq_lens, slots = draft_batch(_context(_metadata()), ["a", "b"], 8, 4)
    assert table.shape == (2, 4) and seq_lens.shape == (2,) and slots.shape == (8,)


@pytest.mark.parametrize(
    "ctx,rows,why",
    [
        (NS(attn_metadata=None, slot_mapping=None), 8, "no attention metadata"),
        (_context(_metadata(), names=("a",)), 8, "no metadata for b"),
        (_context(_metadata(num_prefills=1)), 8, "not a uniform decode batch"),
        (_context(_metadata(decode=None)), 8, "not a uniform decode batch"),
        (_context(_metadata(rows=10)), 10, "not a uniform decode batch"),
        (_context(_metadata(num_decode_tokens=4)), 8, "4 decode tokens of 8 rows"),
        (_context(_metadata(rows=16, reqs=2)), 16, "fewer than 4 requests"),
        (_context(_metadata(), slots=torch.zeros(16, dtype=torch.int32)), 8, "metadata dtypes"),
    ],
)
def test_a_batch_the_kernels_do_not_take_runs_vllms_layers(ctx, rows, why):
    got = draft_batch(ctx, ["a", "b"], rows, 4)
    assert isinstance(got, str) and why in got, got


def test_draft_layers_in_two_cache_groups_run_vllms_layers():
    ctx = _context(_metadata())
    ctx.slot_mapping["b"] = torch.zeros(16, dtype=torch.int64)  # another group's slots
    assert "several KV cache groups" in draft_batch(ctx, ["a", "b"], 8, 4)


@pytest.mark.timeout(300)
def test_a_draft_forward_through_the_glue_is_the_reference_draft_step():
    (m,) = spawn(child.run, 1, 240, env={"TRITON_INTERPRET": "1"})
    assert m["live"] and m["built"] and m["no_context"], m
    assert m["hidden"] < 1e-2 and m["caches"] < 1e-2 and m["padding_zero"], m
    assert m["two_groups"] and m["int32_positions"], m
    assert m["fell_back"] == [
        "draft layers in several KV cache groups (one block table each)",
        "positions of dtype torch.int32",
    ], m
    assert m["kept"] and m["rebuilt"] and m["closed"], m


def test_the_targets_hooks_reach_the_drafters(monkeypatch):
    """The target's model state builds the drafters once the caches are bound, and its
    logits check them: vLLM hands the draft model neither hook."""
    from mono_vllm import drafter
    from mono_vllm.model_state import with_mono
    from mono_vllm.models.text import MonoTextModel

    calls = []
    monkeypatch.setattr(drafter, "prepare_all", lambda: calls.append("prepare"))
    monkeypatch.setattr(drafter, "after_step_all", lambda: calls.append("check"))

    class State:
        def initialize_kv_cache(self, *args):
            calls.append("bound")

    class Text:
        def compute_logits(self, hidden):
            calls.append("logits")
            return hidden

    state = object.__new__(with_mono(State))
    state.mono = None  # the target's own kernels refused: the drafter still gets its hooks
    state.initialize_kv_cache(None, None)
    object.__new__(type("Model", (MonoTextModel, Text), {})).compute_logits(1)
    assert calls == ["bound", "prepare", "check", "logits"]


def test_a_refused_drafter_stays_off_and_says_why(monkeypatch, caplog):
    """A draft config the kernels do not take is agreed, logged once, and vLLM's layers run
    every draft step; no runner is made."""
    import vllm.distributed
    from mono_vllm.drafter import LIVE, MonoDrafter, prepare_all

    cfg = DrafterConfig.tiny()
    w = random_weights(cfg, seed=1)
    caches = [torch.zeros(4, cfg.block_size, cfg.kv_entry, dtype=torch.bfloat16)] * 2
    model = child.standin_model(cfg, w, caches, None, None)
    made = []
    mono = MonoDrafter(child.vllm_config(cfg), model, make_runner=lambda *a: made.append(a))
    assert mono in LIVE
    monkeypatch.setattr(
        vllm.distributed, "get_tp_group", lambda: NS(rank_in_group=0, world_size=3, cpu_group=None)
    )
    caplog.set_level("WARNING", logger="vllm.mono_vllm")
    prepare_all()
    prepare_all()
    assert mono.off and mono.runner is None and not made
    assert mono.forward(torch.arange(4), torch.arange(4), None) is None
    said = [r.getMessage() for r in caplog.records if "mono drafter off" in r.getMessage()]
    assert len(said) == 1 and "num_attention_heads 4 not divisible by tp 3" in said[0], said


def test_a_runner_that_cannot_warm_is_closed_and_the_drafter_off(monkeypatch):
    """warm() refuses a grid that cannot be resident: the built runner is closed (its peer
    buffer freed) and vLLM's draft layers run."""
    import vllm.distributed
    from mono_runtime.errors import MonoUnsupported
    from mono_vllm.drafter import MonoDrafter

    cfg = DrafterConfig.tiny()
    w = random_weights(cfg, seed=1)
    caches = [torch.zeros(4, cfg.block_size, cfg.kv_entry, dtype=torch.bfloat16)] * 2
    model = child.standin_model(cfg, w, caches, None, None)
    seen = []

    class Runner:
        def __init__(self, *args):
            seen.append("built")

        def warm(self):
            raise MonoUnsupported("drafter wide: a grid of 132 programs is not resident")

        def close(self):
            seen.append("closed")

    monkeypatch.setattr(
        vllm.distributed, "get_tp_group", lambda: NS(rank_in_group=0, world_size=1, cpu_group=None)
    )
    mono = MonoDrafter(child.vllm_config(cfg), model, make_runner=Runner)
    mono.prepare_kv()
    assert seen == ["built", "closed"] and mono.off and mono.runner is None
