"""The plugin against vLLM 0.33's own model classes in both of its vendor trees: the
NVIDIA tree (what vLLM builds on CUDA) and the AMD tree (ROCm). Every attribute and method
the plugin's hooks touch exists in the tree whose hooks touch it, the kernel layers take
the calls each tree's layer loop makes, and mono's classes over each tree's are vLLM's plus
the hooks. The classes are imported, never built (vLLM builds neither model on a CPU), so
an attribute counts when the class or a base defines it, a method assigns it on ``self``,
or registers it as a parameter, buffer or module."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from functools import cache

import pytest

pytest.importorskip("vllm")

TREES = ("nvidia", "amd")
MODULES = {
    ("minimax", "nvidia"): "vllm.models.minimax_m3.nvidia.model",
    ("minimax", "amd"): "vllm.models.minimax_m3.amd.model",
    ("kimi", "nvidia"): "vllm.models.kimi_k3.nvidia.model",
    ("kimi", "amd"): "vllm.models.kimi_k3.amd.linear",
    ("kda", "nvidia"): "vllm.models.kimi_k3.nvidia.kda",
    ("kda", "amd"): "vllm.models.kimi_k3.amd.kda",
}
# what mono_vllm (models/, families/, model_state.py) touches on each class, in both trees
# or in one ("nvidia" / "amd": the hooks written for that tree)
TOUCHES = {
    ("minimax", "MiniMaxM3SparseForCausalLM"): {
        "both": "model forward compute_logits load_weights",
    },
    ("minimax", "MiniMaxM3SparseForConditionalGeneration"): {"both": "language_model"},
    ("minimax", "MiniMaxM3Model"): {
        "both": "config start_layer end_layer layers aux_hidden_state_layers",
    },
    ("minimax", "MiniMaxM3DecoderLayer"): {
        "both": "is_moe_layer block_sparse_moe post_attention_layernorm input_layernorm self_attn",
        "nvidia": "fuse_input_allreduce ffn_all_reduce_deferred",
    },
    ("minimax", "MiniMaxM3MoE"): {
        "both": "experts gate e_score_correction_bias shared_experts",
        "amd": "is_fused_shared_expert_enabled",
    },
    ("minimax", "MiniMaxM3MLP"): {"both": "gate_up_proj down_proj"},
    ("minimax", "MiniMaxM3SparseAttention"): {"both": "layer_name kv_cache"},
    ("minimax", "MiniMAXGemmaRMSNorm"): {"both": "weight"},
    ("kimi", "KimiLinearForCausalLM"): {
        "both": "model forward compute_logits load_weights get_model_state_cls",
    },
    ("kimi", "KimiLinearModel"): {"both": "config start_layer end_layer layers"},
    ("kimi", "KimiDecoderLayer"): {
        "both": "self_attn self_attention_res_norm self_attention_res_proj input_layernorm "
        "prev_valid_blocks block_write_idx is_block_write_layer mlp "
        "mlp_res_proj mlp_res_norm post_attention_layernorm",
        "nvidia": "_post_attn_norm _pre_attn_norm",
    },
    ("kimi", "KimiMoE"): {  # families.kimi.k2_weights
        "both": "experts gate shared_experts routed_expert_down_proj routed_expert_norm "
        "routed_expert_up_proj",
    },
    ("kimi", "KimiMLP"): {"both": "gate_up_proj down_proj", "amd": "get_input_quant_key"},
    ("kda", "KimiK3DeltaAttention"): {
        "both": "prefix kv_cache in_proj_qkvgfab f_b_proj conv1d A_log dt_bias o_norm o_proj "
        "local_projection_size",
    },
}


@cache
def members(cls: type) -> frozenset[str]:
    """Names `cls` has: its and its bases' attributes, what their methods assign on
    ``self`` and what they register as parameters, buffers or modules."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue  # builtins and C extensions
        for node in ast.walk(ast.parse(source)):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self":
                        names.add(t.attr)
            registers = ("register_parameter", "register_buffer", "register_module")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) in registers
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return frozenset(names)


def lacks(module: str, name: str, wanted: str) -> list[str]:
    """The names of `wanted` (space-separated) that vLLM's class `module.name` lacks."""
    cls = getattr(importlib.import_module(module), name)
    return [a for a in wanted.split() if a not in members(cls)]


def vllm_class(model: str, tree: str, name: str) -> type:
    return getattr(importlib.import_module(MODULES[model, tree]), name)


DSPARK = "vllm.models.kimi_k3.nvidia.dspark_mla"
# classes of one tree (or of none) that the MLA + K2 layers (families.kimi) and the DSpark
# drafter's glue (drafter.py, models/dspark.py: vLLM has one draft model class) touch
ONE_TREE = {
    ("vllm.models.kimi_k3.nvidia.mla", "MultiHeadLatentAttention"): (
        "_forward_q_lora _forward_full_rank_q q_lora_rank o_proj "
        "layer_name kv_cache kv_cache_dtype use_output_gate rotary_emb fused_qkv_a_proj "
        "q_a_layernorm kv_a_layernorm q_b_proj kv_b_proj"
    ),
    ("vllm.models.kimi_k3.amd.linear", "KimiMLAAttention"): "mla_attn get_input_quant_key o_proj",
    (DSPARK, "K3DSparkForCausalLM"): "model forward load_weights",
    (DSPARK, "K3DSparkModel"): "layers final_norm embed_input_ids",
    (DSPARK, "K3DSparkDecoderLayer"): "self_attn mlp input_layernorm post_attention_layernorm",
    ("vllm.model_executor.layers.layernorm", "RMSNorm"): "weight",
    ("vllm.model_executor.layers.rotary_embedding", "RotaryEmbedding"): "cos_sin_cache",
}


@pytest.mark.parametrize("module,name", list(ONE_TREE), ids=[n for _, n in ONE_TREE])
def test_what_one_trees_hooks_touch_exists(module, name):
    missing = lacks(module, name, ONE_TREE[module, name])
    assert not missing, f"vLLM's {name} has no {missing}"


def test_the_mla_k2_layers_calls_exist():
    from vllm.models.kimi_k3.amd.linear import _apply_attn_res
    from vllm.models.kimi_k3.amd.mla import KimiK3MultiHeadLatentAttentionWrapper
    from vllm.models.kimi_k3.nvidia.mla import _gate_sigmoid_mul

    assert (
        "skip_o_proj" in inspect.signature(KimiK3MultiHeadLatentAttentionWrapper.forward).parameters
    )
    assert "block_write_idx" in inspect.signature(_apply_attn_res).parameters
    assert list(inspect.signature(_gate_sigmoid_mul).parameters) == ["attn_out", "gate"]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("model,name", list(TOUCHES), ids=[n for _, n in TOUCHES])
def test_what_the_hooks_touch_exists_in_vllms_classes(tree, model, name):
    cls = vllm_class(model, tree, name)
    wanted = " ".join(TOUCHES[model, name].get(k, "") for k in ("both", tree)).split()
    missing = [a for a in wanted if a not in members(cls)]
    assert not missing, f"vLLM's {tree} {name} has no {missing}"


def test_the_amd_tree_lacks_the_nvidia_trees_hand_offs():
    """What the plugin's NVIDIA hooks use and vLLM's AMD classes do not have (why each
    tree has hooks of its own), and the shared machinery both trees' MoE layers use."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    layer = members(vllm_class("minimax", "amd", "MiniMaxM3DecoderLayer"))
    assert not {"fuse_input_allreduce", "ffn_all_reduce_deferred"} & layer
    assert "_post_attn_norm" not in members(vllm_class("kimi", "amd", "KimiDecoderLayer"))
    assert callable(importlib.import_module(MODULES["kimi", "amd"])._apply_attn_res)
    assert "routed_experts" in members(MoERunner)
    assert {"quant_method", "moe_config"} <= members(RoutedExperts)


def _positional(fn) -> list[str]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
    return [p.name for p in params if p.kind in kinds]


@pytest.mark.parametrize("tree", TREES)
def test_kernel_layers_take_the_calls_of_each_trees_layer_loop(tree):
    """A kernel layer stands in for vLLM's decoder layer: the same parameters, so the
    model's loop can call it by position (AMD) or by keyword (NVIDIA)."""
    from mono_vllm.families.kimi import AmdKdaLayer, KdaLayer
    from mono_vllm.families.minimax import FfnLayer

    minimax = vllm_class("minimax", tree, "MiniMaxM3DecoderLayer").forward
    assert _positional(FfnLayer.__call__) == _positional(minimax)
    kimi = vllm_class("kimi", tree, "KimiDecoderLayer").forward
    ours = AmdKdaLayer if tree == "amd" else KdaLayer
    assert _positional(ours.__call__) == _positional(kimi)


@pytest.mark.parametrize("tree", TREES)
def test_mono_classes_over_each_tree(tree):
    """mono's text classes over vLLM's: subclasses, the batch-sharded logits hook only
    where vLLM's class has one, and the model state vLLM picks in that tree plus mono's."""
    from mono_vllm.families.kimi import KimiKdaKernels
    from mono_vllm.families.minimax import MiniMaxFfnKernels
    from mono_vllm.models.text import mono_class
    from mono_vllm.variants import variant
    from vllm.v1.worker.gpu.model_states import resolve_model_state_cls

    states = {
        "nvidia": (
            "vllm.v1.worker.gpu.model_states.default:DefaultModelState",
            "vllm.models.kimi_k3.nvidia.model_state:KimiK3ModelState",
        ),
        "amd": (
            "vllm.models.minimax_m3.amd.model_state:MiniMaxM3ModelState",
            "vllm.models.kimi_k3.amd.specialized_decode.model_state:KimiK3ModelState",
        ),
    }[tree]
    for (model, name, family), state in zip(
        (
            ("minimax", "MiniMaxM3SparseForCausalLM", MiniMaxFfnKernels),
            ("kimi", "KimiLinearForCausalLM", KimiKdaKernels),
        ),
        states,
        strict=True,
    ):
        base = vllm_class(model, tree, name)
        cls = mono_class(base, family, __name__)
        assert issubclass(cls, base) and cls.__name__ == f"Mono{name}"
        assert hasattr(cls, "compute_logits_local") == hasattr(base, "compute_logits_local")
        text = object.__new__(cls)  # no weights: the class is enough
        module, state_name = state.split(":")
        want = getattr(importlib.import_module(module), state_name)
        got = resolve_model_state_cls(None, text)
        assert issubclass(got, want) and got.__name__ == f"Mono{state_name}", (name, got)
        if model == "minimax":  # vLLM asks the checkpoint's top-level class
            wrapper_cls = vllm_class(model, tree, "MiniMaxM3SparseForConditionalGeneration")
            if tree == "nvidia":  # vLLM's NVIDIA wrapper hands over no state: mono's does
                from mono_vllm.models.minimax import (
                    MonoMiniMaxM3SparseForConditionalGeneration as wrapper_cls,
                )
            wrapper = object.__new__(wrapper_cls)
            object.__setattr__(wrapper, "language_model", text)
            assert resolve_model_state_cls(None, wrapper) is got
    for model, name in (("minimax", "MiniMaxM3Model"), ("kimi", "KimiLinearModel")):
        assert variant(object.__new__(vllm_class(model, tree, name))) == tree
