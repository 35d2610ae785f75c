"""What a deployment asks of the kernels, read once from vLLM's config, and why they refuse it.

`Deployment.of(vllm_config)` snapshots the settings that decide whether mono's decode can
run (every one is identical on all ranks); `deployment_reasons` lists each setting the
kernels do not serve. Keeping the snapshot plain makes every refusal testable without
building a vLLM engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .switch import requested


@dataclass(frozen=True)
class KernelSupport:
    """What one model's layer kernels serve (declared by its `family`)."""

    tp: tuple[int, ...]  # tensor-parallel degrees with a build
    max_rows: int  # widest step (requests x tokens per request) with a kernel
    kv_cache_dtype: str | None = None  # the KV cache dtype the kernels read, None: any


@dataclass(frozen=True)
class Deployment:
    """The settings of one vLLM deployment that the kernels care about."""

    architecture: str
    tp: int
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    dbo: bool = False
    dcp: int = 1
    lora: bool = False
    sleep_mode: bool = False
    v2_runner: bool = True
    compile_mode: str = "NONE"  # CompilationMode name
    decode_graphs: str = "FULL"  # NONE (eager), PIECEWISE or FULL: how decode steps run
    kv_cache_dtype: str = "bf16"
    speculative_tokens: int = 0
    vllm_decode_backend: str = "auto"  # vLLM's own additional_config["decode_backend"]
    vllm_monokernel: bool = False  # vLLM's own --monokernel (kernel_config.monokernel)
    requested: bool = False

    @property
    def q(self) -> int:
        """Rows a request verifies per step: 1 + speculative tokens."""
        return 1 + self.speculative_tokens

    @classmethod
    def of(cls, vllm_config: Any) -> Deployment:
        """The snapshot of a `vllm.config.VllmConfig`."""
        from vllm.config import CUDAGraphMode

        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        cc, comp = vllm_config.cache_config, vllm_config.compilation_config
        extra = vllm_config.additional_config
        graphs = comp.cudagraph_mode
        if graphs is None or graphs == CUDAGraphMode.NONE:
            decode_graphs = "NONE"
        else:
            decode_graphs = graphs.decode_mode().name
        spec = vllm_config.speculative_config
        return cls(
            architecture=(mc.architectures or ["?"])[0],
            tp=pc.tensor_parallel_size,
            pp=pc.pipeline_parallel_size,
            dp=pc.data_parallel_size,
            expert_parallel=bool(pc.enable_expert_parallel),
            dbo=bool(pc.use_ubatching),
            dcp=pc.decode_context_parallel_size,
            lora=vllm_config.lora_config is not None,
            sleep_mode=bool(mc.enable_sleep_mode),
            v2_runner=bool(vllm_config.use_v2_model_runner),
            compile_mode=comp.mode.name,
            decode_graphs=decode_graphs,
            kv_cache_dtype=_kv_dtype_name(cc.cache_dtype, mc.dtype),
            speculative_tokens=(spec.num_speculative_tokens or 0) if spec else 0,
            vllm_decode_backend=(
                extra.get("decode_backend", "auto") if isinstance(extra, dict) else "auto"
            ),
            vllm_monokernel=bool(vllm_config.kernel_config.monokernel),
            requested=requested(extra),
        )


def _kv_dtype_name(cache_dtype: str, model_dtype: Any) -> str:
    """``auto`` means the model's dtype; name it the way users write dtypes."""
    if cache_dtype != "auto":
        return str(cache_dtype)
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(
        str(model_dtype), str(model_dtype)
    )


def deployment_reasons(d: Deployment, support: KernelSupport) -> list[str]:
    """Every reason the kernels cannot serve deployment `d` (empty: they can)."""
    own = [f"decode_backend={d.vllm_decode_backend}"] if d.vllm_decode_backend != "auto" else []
    own += ["--monokernel"] if d.vllm_monokernel else []
    checks = (
        (
            bool(own),
            f"vLLM's own specialized decode ({' and '.join(own)}) is on: it and mono's "
            "replace the same layers, so one of them must be off",
        ),
        (
            d.tp not in support.tp,
            f"TP {d.tp} not supported (kernels for TP {', '.join(map(str, support.tp))})",
        ),
        (d.pp != 1, f"pipeline parallelism (PP {d.pp})"),
        (d.dp != 1, f"data parallelism (DP {d.dp})"),
        (d.expert_parallel, "expert parallelism"),
        (d.dbo, "DBO (dual-batch overlap): the kernels read one batch's metadata per step"),
        (d.dcp != 1, f"decode context parallelism (DCP {d.dcp})"),
        (d.lora, "LoRA"),
        (d.sleep_mode, "sleep mode: the kernels read the loaded weights in place"),
        (
            not d.v2_runner,
            "the V1 model runner (the plugin hooks Model Runner V2; "
            "set VLLM_USE_V2_MODEL_RUNNER=1)",
        ),
        (
            d.compile_mode == "STOCK_TORCH_COMPILE",
            "torch.compile of the whole model (compilation mode STOCK_TORCH_COMPILE)",
        ),
        (
            d.decode_graphs == "PIECEWISE",
            "PIECEWISE graphs: decode steps would run stock; use FULL decode graphs "
            "(cudagraph_mode FULL_AND_PIECEWISE or FULL_DECODE_ONLY) or eager",
        ),
        (
            support.kv_cache_dtype is not None and d.kv_cache_dtype != support.kv_cache_dtype,
            f"KV cache dtype {d.kv_cache_dtype}: needs {support.kv_cache_dtype}",
        ),
        (
            d.q > support.max_rows,
            f"{d.speculative_tokens} speculative tokens: a request's {d.q} rows exceed "
            f"the kernels' {support.max_rows}",
        ),
    )
    return [why for bad, why in checks if bad]
