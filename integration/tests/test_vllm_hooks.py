"""The plugin against the installed vLLM 0.33 (CPU): discovery, registration, model-state
hooks, the deployment refusals on a real VllmConfig, and the StepMeta adapter on metadata
built by vLLM's own builders. One module, so vLLM is imported once per test run."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import replace

import pytest
import torch

vllm = pytest.importorskip("vllm")

from mono_runtime.planner import GraphMode, StepMeta, plan, step_reason  # noqa: E402
from mono_vllm.deployment import Deployment, KernelSupport, deployment_reasons  # noqa: E402
from mono_vllm.meta import step_meta  # noqa: E402
from mono_vllm.plugin import MODELS  # noqa: E402
from mono_vllm.switch import SWITCH, requested  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402

LAYER = "model.layers.1.self_attn.attn"
TINY_MINIMAX = {
    "model_type": "minimax_m3_vl",
    "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
    "torch_dtype": "bfloat16",
    "text_config": {
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32,
        "dense_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 16, "num_local_experts": 8,
        "num_experts_per_tok": 2, "moe_layer_freq": [0, 1], "torch_dtype": "bfloat16",
        "sparse_attention_config": {
            "use_sparse_attention": True, "sparse_index_dim": 16, "sparse_num_index_heads": 1,
            "sparse_topk_blocks": 2, "sparse_block_size": 128,
            "sparse_disable_index_value": [0, 1], "sparse_score_type": "max",
            "sparse_init_block": 0, "sparse_local_block": 1, "sparse_attention_freq": [0, 1],
        },
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    path = tmp_path_factory.mktemp("minimax_m3_tiny")
    (path / "config.json").write_text(json.dumps(TINY_MINIMAX))
    model = ModelConfig(model=str(path), skip_tokenizer_init=True, max_model_len=1024)
    return VllmConfig(
        model_config=model,
        parallel_config=ParallelConfig(tensor_parallel_size=2),
        cache_config=CacheConfig(cache_dtype="fp8"),
        device_config=DeviceConfig(device="cpu"),
        additional_config={SWITCH: True},
    )


# -- discovery and registration -------------------------------------------------------------
@pytest.fixture
def cuda_platform(monkeypatch):
    """vLLM's current platform answering is_cuda() (registration asks it; nothing else)."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)


def test_entry_point_is_found_and_registers_mono_classes(monkeypatch):
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    found = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins")]
    mono = [e for e in found if e.name == "mono"]
    assert [e.value for e in mono] == ["mono_vllm.plugin:register"]
    register = mono[0].load()
    with monkeypatch.context() as patch:  # as on CUDA, for registering only
        patch.setattr(current_platform, "is_cuda", lambda: True)
        register()
        register()  # vLLM may call it more than once per process
    for arch, target in MODELS.items():
        entry = ModelRegistry.models[arch]
        assert f"{entry.module_name}:{entry.class_name}" == target
        cls = ModelRegistry._try_load_model_cls(arch)
        stock = _stock_class(arch)
        assert cls.__name__ == f"Mono{stock.__name__}" and issubclass(cls, stock)


def test_nothing_is_registered_where_the_kernels_have_no_build():
    """On a CPU (this machine: vLLM's platform has neither CUDA nor ROCm) vLLM's own
    classes stay registered."""
    from mono_vllm.plugin import register
    from vllm import ModelRegistry

    before = {arch: ModelRegistry.models[arch] for arch in MODELS}
    register()
    assert {arch: ModelRegistry.models[arch] for arch in MODELS} == before


def test_vllms_plugin_loader_registers_mono(cuda_platform):
    """vLLM's own loader (what every vLLM process runs) finds and runs the entry point."""
    import vllm.plugins
    from vllm import ModelRegistry

    stock = ModelRegistry.models["KimiLinearForCausalLM"]
    ModelRegistry.register_model(
        "KimiLinearForCausalLM", "vllm.models.kimi_k3:KimiLinearForCausalLM"
    )
    loaded, vllm.plugins.plugins_loaded = vllm.plugins.plugins_loaded, False
    try:
        vllm.plugins.load_general_plugins()
        entry = ModelRegistry.models["KimiLinearForCausalLM"]
        assert (entry.module_name, entry.class_name) == (
            "mono_vllm.models.kimi",
            "MonoKimiLinearForCausalLM",
        )
    finally:
        vllm.plugins.plugins_loaded = loaded
        ModelRegistry.models["KimiLinearForCausalLM"] = stock


def test_layer_slots_come_from_the_forward_context():
    from mono_vllm.families.minimax import vllm_slots
    from vllm.forward_context import override_forward_context

    mapping = torch.tensor([[7, 9, -1, -1]])
    ctx = ForwardContext(
        no_compile_layers={}, attn_metadata={}, slot_mapping={LAYER: mapping[0]},
        cudagraph_runtime_mode=CUDAGraphMode.NONE,
    )  # fmt: skip
    with override_forward_context(ctx):
        slots = vllm_slots(LAYER, 3)()
    assert slots.tolist() == [7, 9, -1] and slots.data_ptr() == mapping.data_ptr()


def _stock_class(arch: str) -> type:
    """The class vLLM exports for `arch` (its draft model's: the one its registry names)."""
    if arch == "K3DSparkModel":
        return importlib.import_module("vllm.models.kimi_k3.nvidia.dspark_mla").K3DSparkForCausalLM
    module = "vllm.models.kimi_k3" if arch.startswith("Kimi") else "vllm.models.minimax_m3"
    return getattr(importlib.import_module(module), arch)


def test_model_state_is_vllms_plus_mono():
    """vLLM's resolver asks the top-level model; mono's state extends the one vLLM picks."""
    from mono_vllm.models.kimi import MonoKimiLinearForCausalLM
    from mono_vllm.models.minimax import (
        MonoMiniMaxM3SparseForCausalLM,
        MonoMiniMaxM3SparseForConditionalGeneration,
    )
    from vllm.models.kimi_k3.nvidia.model_state import KimiK3ModelState
    from vllm.v1.worker.gpu.model_states import resolve_model_state_cls
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    text = object.__new__(MonoMiniMaxM3SparseForCausalLM)  # no weights: the class is enough
    wrapper = object.__new__(MonoMiniMaxM3SparseForConditionalGeneration)
    object.__setattr__(wrapper, "language_model", text)
    for model, base in (
        (text, DefaultModelState),
        (wrapper, DefaultModelState),
        (object.__new__(MonoKimiLinearForCausalLM), KimiK3ModelState),
    ):
        state = resolve_model_state_cls(None, model)
        assert issubclass(state, base) and state.__name__ == f"Mono{base.__name__}"
        assert {"__init__", "initialize_kv_cache", "prepare_attn"} <= set(vars(state))


# -- the switch and the deployment ----------------------------------------------------------
def test_switch():
    assert requested({SWITCH: True}) and not requested({SWITCH: False})
    assert not requested({}) and not requested(None)
    assert not requested({"decode_backend": "latency_specialized"})
    with pytest.raises(ValueError, match="mono_decode.*true or false.*'yes'"):
        requested({SWITCH: "yes"})


def test_deployment_snapshot_of_a_real_config(vllm_config):
    d = Deployment.of(vllm_config)
    assert d.architecture == "MiniMaxM3SparseForConditionalGeneration"
    assert (d.tp, d.pp, d.dp, d.kv_cache_dtype, d.q) == (2, 1, 1, "fp8", 1)
    assert d.requested and d.vllm_decode_backend == "auto" and not d.lora
    assert d.decode_graphs in ("NONE", "FULL", "PIECEWISE")
    auto = vllm_config.cache_config.cache_dtype
    try:
        vllm_config.cache_config.cache_dtype = "auto"
        assert Deployment.of(vllm_config).kv_cache_dtype == "bf16"  # the model's dtype
    finally:
        vllm_config.cache_config.cache_dtype = auto


GOOD = Deployment(architecture="MiniMaxM3SparseForCausalLM", tp=4, kv_cache_dtype="fp8")
SUPPORT = KernelSupport(tp=(1, 2, 4, 8), max_rows=16, kv_cache_dtype="fp8")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"tp": 3}, "TP 3 not supported (kernels for TP 1, 2, 4, 8)"),
        ({"kv_cache_dtype": "bf16"}, "KV cache dtype bf16: needs fp8"),
        ({"decode_graphs": "PIECEWISE"}, "PIECEWISE graphs"),
        ({"pp": 2}, "pipeline parallelism (PP 2)"),
        ({"dp": 2}, "data parallelism (DP 2)"),
        ({"expert_parallel": True}, "expert parallelism"),
        ({"dbo": True}, "DBO (dual-batch overlap)"),
        ({"dcp": 2}, "decode context parallelism (DCP 2)"),
        ({"lora": True}, "LoRA"),
        ({"sleep_mode": True}, "sleep mode"),
        ({"v2_runner": False}, "the V1 model runner"),
        ({"compile_mode": "STOCK_TORCH_COMPILE"}, "torch.compile of the whole model"),
        ({"speculative_tokens": 16}, "16 speculative tokens: a request's 17 rows exceed"),
        (
            {"vllm_decode_backend": "latency_specialized"},
            "vLLM's own specialized decode (decode_backend=latency_specialized) is on: it and "
            "mono's replace the same layers",
        ),
        ({"vllm_monokernel": True}, "vLLM's own specialized decode (--monokernel) is on"),
        (
            {"vllm_monokernel": True, "vllm_decode_backend": "latency_specialized"},
            "vLLM's own specialized decode (decode_backend=latency_specialized and "
            "--monokernel) is on",
        ),
    ],
)
def test_each_refusal_reason(change, reason):
    assert deployment_reasons(GOOD, SUPPORT) == []
    got = deployment_reasons(replace(GOOD, **change), SUPPORT)
    assert len(got) == 1 and got[0].startswith(reason), got


def test_eager_and_full_graphs_and_any_kv_dtype_are_served():
    for graphs in ("NONE", "FULL"):
        assert deployment_reasons(replace(GOOD, decode_graphs=graphs), SUPPORT) == []
    any_kv = replace(SUPPORT, kv_cache_dtype=None)
    assert deployment_reasons(replace(GOOD, kv_cache_dtype="bf16"), any_kv) == []


# -- the StepMeta adapter on vLLM's own metadata --------------------------------------------
@pytest.fixture(scope="module")
def builder(vllm_config):
    """MiniMax-M3's sparse-attention metadata builder, as vLLM builds it."""
    from vllm.config import set_current_vllm_config
    from vllm.models.minimax_m3.common.sparse_attention import MiniMaxM3SparseMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=128, num_kv_heads=1, head_size=16, dtype=torch.bfloat16)
    with set_current_vllm_config(vllm_config):
        return MiniMaxM3SparseMetadataBuilder(spec, [LAYER], vllm_config, torch.device("cpu"))


def _metadata(builder, query_lens, threshold=1, padded_reqs=0):
    """vLLM's CommonAttentionMetadata for a batch, and the builder's metadata of it. Under
    a FULL graph vLLM pads whole requests: empty ones, with the graph's token count."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    lens = list(query_lens) + [0] * padded_reqs
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor([n + 5 for n in lens], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        seq_lens_cpu_upper_bound=seq,
        num_reqs=len(lens),
        num_actual_tokens=int(qsl[-1]) + padded_reqs * max(lens),
        max_query_len=max(lens),
        max_seq_len=int(seq.max()),
        block_table_tensor=torch.zeros(len(lens), 4, dtype=torch.int32),
        slot_mapping=torch.arange(int(qsl[-1]) + padded_reqs * max(lens), dtype=torch.int64),
    )
    builder.reorder_batch_threshold = threshold  # 1 + num_speculative_tokens in vLLM
    return common, builder.build(0, common)


def _context(metadata, mode=CUDAGraphMode.NONE):
    return ForwardContext(
        no_compile_layers={}, attn_metadata=metadata, slot_mapping={}, cudagraph_runtime_mode=mode
    )


def _meta(common, md, mode=CUDAGraphMode.NONE, rows=None, kv_bound=True):
    return step_meta(
        _context({LAYER: md}, mode),
        LAYER,
        common.query_start_loc_cpu,
        model_rows=common.num_actual_tokens if rows is None else rows,
        kv_bound=kv_bound,
        intermediate_input=False,
        positions_dtype="int64",
    )


TABLE = {w: {1: f"kernel@{w}"} for w in range(1, 17)}


def test_pure_decode(builder):
    meta = _meta(*_metadata(builder, [1, 1, 1]))
    assert isinstance(meta, StepMeta)
    assert (meta.num_decodes, meta.num_spec_verifies, meta.num_prefills) == (3, 0, 0)
    assert meta.query_lens == (1, 1, 1) and meta.graph_mode is GraphMode.NONE
    step = plan(meta, TABLE, q=1)
    assert step.width == 3 and step.layer(1) == "kernel@3" and step.layer(0) is None


def test_spec_verify(builder):
    meta = _meta(*_metadata(builder, [3, 3], threshold=3))
    assert (meta.num_decodes, meta.num_spec_verifies, meta.num_prefills) == (0, 2, 0)
    assert plan(meta, TABLE, q=3).width == 6
    assert step_reason(meta, 6, 1) == "2 spec-verify request(s) in a decode deployment"


def test_mixed_prefill_and_decode_runs_stock(builder):
    meta = _meta(*_metadata(builder, [1, 1, 5]))
    assert (meta.num_decodes, meta.num_prefills) == (2, 1)
    assert plan(meta, TABLE, q=1) is None
    assert step_reason(meta, meta.rows, 1) == "1 prefill request(s)"


def test_padded_full_graph_step(builder):
    """A FULL graph of 4 two-row requests holding 3 real ones: the padding request is
    served like a real one, so the step has the graph's 8 rows."""
    common, md = _metadata(builder, [2, 2, 2], threshold=2, padded_reqs=1)
    assert md.num_decodes == 4  # vLLM counts the empty padding request as a decode
    meta = _meta(common, md, CUDAGraphMode.FULL, rows=8)
    assert meta.query_lens == (2, 2, 2, 2) and meta.graph_mode is GraphMode.FULL
    assert plan(meta, TABLE, q=2).width == 8
    # outside a FULL graph an empty request is not padding the kernels can serve
    assert _meta(common, md, CUDAGraphMode.NONE, rows=8) == "an empty request outside a FULL graph"


def test_token_padding_outside_requests_is_refused(builder):
    common, md = _metadata(builder, [1, 1])
    assert _meta(common, md, rows=4) == "2 rows outside every request (token padding)"


def test_step_before_any_kv_cache_is_bound(builder):
    common, md = _metadata(builder, [1, 1])
    meta = _meta(common, md, kv_bound=False)
    assert step_reason(meta, 2, 1) == "no KV cache bound (profiling or dummy run)"
    # a profiling run builds no metadata at all
    for metadata in (None, {}):
        ctx = _context(metadata)
        meta = step_meta(ctx, LAYER, None, 2, True, False, "int64")
        assert plan(meta, TABLE, q=1) is None and not meta.kv_bound


def test_piecewise_step_runs_stock(builder):
    meta = _meta(*_metadata(builder, [1, 1]), CUDAGraphMode.PIECEWISE)
    assert plan(meta, TABLE, q=1) is None
    assert step_reason(meta, 2, 1).startswith("PIECEWISE graph")


def test_stale_query_starts_are_not_this_steps(builder):
    common, md = _metadata(builder, [1, 1, 1])
    other, _ = _metadata(builder, [1, 1])
    got = step_meta(_context({LAYER: md}), LAYER, other.query_start_loc_cpu, 3, True, False, "")
    assert got == "metadata of 3 requests for a batch of 2: not this step's"


def test_kda_metadata_spec_verify():
    """Kimi-K3's KDA metadata (vLLM's GDN split): pure spec-verify and a ragged mix."""
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadata

    def kda(prefills, decodes, verifies, q):
        return KimiK3KDAMetadata(
            num_prefills=prefills, num_prefill_tokens=5 * prefills, num_decodes=decodes,
            num_decode_tokens=decodes, num_spec_decodes=verifies,
            num_spec_decode_tokens=q * verifies,
            num_actual_tokens=5 * prefills + decodes + q * verifies,
            uniform_spec_sequence_length=q,
        )  # fmt: skip

    starts = torch.tensor([0, 4, 8])
    ctx = _context({"kda": kda(0, 0, 2, 4)}, CUDAGraphMode.FULL)
    meta = step_meta(ctx, "kda", starts, 8, True, False, "int64")
    assert (meta.num_spec_verifies, meta.query_lens) == (2, (4, 4))
    assert plan(meta, {8: {0: "k1"}}, q=4).layer(0) == "k1"
    ctx = _context({"kda": kda(1, 1, 0, 4)})
    meta = step_meta(ctx, "kda", torch.tensor([0, 1, 6]), 6, True, False, "int64")
    assert (meta.num_prefills, meta.num_decodes) == (1, 1)
    assert plan(meta, {6: {0: "k1"}}, q=1) is None


# -- MonoDecode: vLLM's hooks around a backbone, on vLLM's own TP group ---------------------
class FakeRunner:
    def __init__(self, device, group, rank, world, scratch, peer):
        self.calls = []

    def step_begin(self):
        self.calls.append("step_begin")

    def guard(self, hidden):
        self.calls.append("guard")

    def after_step(self):
        self.calls.append("after_step")

    def close(self):
        self.calls.append("close")


class FakeFamily:
    """Kernel layer 1 of a two-layer backbone; everything but the kernels is real."""

    name, dtypes, notes = "fake", {}, ("a note for the operator",)
    support = KernelSupport(tp=(1, 2), max_rows=4)

    def __init__(self, backbone, deployment, rank, world):
        self.layers, self.metadata_key, self.kv, self.launches = (1,), LAYER, None, []

    def check(self):
        return []

    def runner_bytes(self, widths):
        return 8, 8

    def build(self, runner, widths):
        def kernel(positions, hidden, residual):
            self.launches.append(hidden.shape[0])
            return hidden + 100, residual

        return {w: {1: kernel} for w in widths}

    def step_begin(self, runner):
        runner.step_begin()

    def kv_key(self):
        return self.kv

    def kv_check(self):
        return []

    def close(self):
        pass


class Layer(torch.nn.Module):
    def forward(self, positions, hidden, residual):
        return hidden + 1, residual


class Text(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([Layer(), Layer()])
        self.model.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))

    def forward(self, hidden):
        for layer in self.model.layers:
            hidden, _ = layer(None, hidden, None)
        return hidden


@pytest.fixture(scope="module")
def tp_group(vllm_config):
    """vLLM's own process groups, one rank over gloo."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
    yield
    destroy_model_parallel()


@pytest.fixture
def mono_logs():
    import logging

    from mono_vllm.host import LOGGER

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_mono_decode_drives_the_executor_through_vllms_hooks(
    vllm_config, tp_group, builder, mono_logs
):
    from mono_vllm.host import MonoDecode
    from vllm.forward_context import override_forward_context

    text = Text()
    mono = MonoDecode(vllm_config, FakeFamily, text, make_runner=FakeRunner)
    mono.build()
    (on,) = [r.getMessage() for r in mono_logs]
    assert on.startswith("mono decode on") and on.endswith("; a note for the operator")
    family, runner = mono.kernels, mono.executor.runner
    assert type(text.model.layers[1]).__name__ == "MonoLayer"
    assert mono.executor.widths == [1, 2, 3, 4]
    common, md = _metadata(builder, [1, 1])
    x = torch.zeros(2, 4)

    def step(metadata=None):
        metadata = metadata or {LAYER: md}
        mono.record_batch(metadata, common.query_start_loc_cpu)
        with override_forward_context(_context(metadata)):
            positions = torch.zeros(2, dtype=torch.int64)
            mono.begin(positions, None)
            out = mono.end(text(x))
        mono.after_step()
        return out

    mono.prepare_kv()  # the profiling run binds no cache the kernels read: stock
    assert torch.equal(step(), x + 2) and family.launches == []
    family.kv = 1
    mono.prepare_kv()
    assert torch.equal(step(), x + 101) and family.launches == [2]
    assert runner.calls == ["after_step", "step_begin", "guard", "after_step"]
    # query starts recorded for another step's metadata are not this step's: stock
    mono.record_batch({LAYER: md}, common.query_start_loc_cpu)
    with override_forward_context(_context({LAYER: md})):
        mono.begin(torch.zeros(2, dtype=torch.int64), None)
        assert torch.equal(mono.end(text(x)), x + 2)
    with pytest.raises(RuntimeError, match="weight reloads are not supported"):
        mono.refuse_reload()
    mono.close()
    assert type(text.model.layers[1]) is Layer and runner.calls[-1] == "close"


def test_a_refused_deployment_logs_once_and_stays_stock(vllm_config, tp_group, mono_logs):
    from mono_vllm.host import MonoDecode

    text = Text()
    mono = MonoDecode(vllm_config, FakeFamily, text, make_runner=FakeRunner)
    mono.deployment = replace(mono.deployment, tp=3, decode_graphs="PIECEWISE")
    mono.build()
    assert mono.executor is None and type(text.model.layers[1]) is Layer
    assert len(mono_logs) == 1 and mono_logs[0].levelname == "WARNING"
    message = mono_logs[0].getMessage()
    assert "mono decode off, vLLM's decode runs" in message
    assert "TP 3 not supported" in message and "PIECEWISE graphs" in message
    mono.after_step()  # a no-op: vLLM's path
    mono.refuse_reload()
