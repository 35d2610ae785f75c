"""mono's decode inside one vLLM text model: the glue between vLLM's hooks and the executor.

Created in the model's ``__init__`` when ``mono_decode`` is set (cheap: it reads the
config); the model state calls `build` once the weights are loaded, `prepare_kv` after
each KV cache is bound and `record_batch` with each step's metadata; the model calls
`begin` / `end` around its forward and `after_step` before its logits. Every refusal is agreed on
all TP ranks, logged once with its reasons, and leaves vLLM's path running: the plugin
never stops a server that vLLM alone could run.
"""

from __future__ import annotations

from typing import Any

import torch
from mono_runtime.errors import MonoUnsupported
from mono_runtime.planner import StepMeta

from . import dispatch
from .deployment import Deployment, deployment_reasons
from .executor import MonoExecutor
from .meta import step_meta
from .switch import SWITCH, requested

LOGGER = "vllm.mono_vllm"  # under vLLM's logger: its handler, format and level


def vllm_logger():
    from vllm.logger import init_logger

    return init_logger(LOGGER)


class MonoDecode:
    """mono's decode over one loaded text model (``model.model`` is vLLM's backbone)."""

    @classmethod
    def requested(cls, vllm_config: Any, family: type, model: Any) -> MonoDecode | None:
        """A `MonoDecode` when the deployment sets ``mono_decode``, else None."""
        if not requested(vllm_config.additional_config):
            return None
        return cls(vllm_config, family, model)

    def __init__(self, vllm_config: Any, family: type, model: Any, make_runner: Any = None) -> None:
        """`make_runner(device, group, rank, world, scratch, peer)`: the rank's runner
        (`mono_runtime.MonoRunner` unless given)."""
        self.make_runner = make_runner
        self.deployment = Deployment.of(vllm_config)
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.family, self.model = family, model
        self.executor: MonoExecutor | None = None
        self.kernels: Any = None
        self._batch: tuple[Any, Any] | None = None  # (attention metadata dict, query starts)
        self._captured: set[int] = set()
        self.rank = 0

    # -- lifecycle ------------------------------------------------------------------------
    def build(self) -> None:
        """Checks, builds and warms the executor; on refusal logs why and stays off."""
        from vllm.distributed import get_tp_group

        make_runner = self.make_runner
        if make_runner is None:
            from mono_runtime.runner import MonoRunner as make_runner
        tp = get_tp_group()
        self.rank = tp.rank_in_group
        backbone = self.model.model
        d, support = self.deployment, self.family.support
        self.kernels = self.family(backbone, d, tp.rank_in_group, tp.world_size)
        rows = min(support.max_rows, d.q * self.max_num_seqs)
        device = next(backbone.parameters()).device
        try:
            self.executor = MonoExecutor.build(
                self.kernels,
                q=d.q,
                widths=range(d.q, rows + 1, d.q),
                group=tp.cpu_group,
                make_runner=lambda scratch, peer: make_runner(
                    device, tp.cpu_group, tp.rank_in_group, tp.world_size, scratch, peer
                ),
                reasons=deployment_reasons(d, support),
            )
        except MonoUnsupported as err:
            self._off(err)
            return
        for i in self.kernels.layers:
            dispatch.install(backbone.layers[i], i, self.executor)
        if self.rank == 0:
            vllm_logger().info(
                "mono decode on (%s=true): %s kernels replace %d decoder layers on pure "
                "decode/spec-verify steps of %s rows at TP %d; every other step runs "
                "vLLM's layers%s",
                SWITCH,
                self.kernels.name,
                len(self.kernels.layers),
                self.executor.widths,
                d.tp,
                "".join(f"; {note}" for note in self.kernels.notes),
            )

    def prepare_kv(self) -> None:
        """Binds the executor to the KV cache vLLM just bound (profiling, then real)."""
        if self.executor is None:
            return
        try:
            self.executor.prepare_kv()
        except MonoUnsupported as err:
            self._off(err)

    def close(self) -> None:
        if self.executor is None:
            return
        for i in self.kernels.layers:
            dispatch.uninstall(self.model.model.layers[i])
        self.executor.close()
        self.executor = None

    def _off(self, err: MonoUnsupported) -> None:
        """Back to vLLM's layers for good, on every rank alike (the refusal was agreed)."""
        self.close()
        # once: rank 0 states the agreed refusal; another rank only its own reasons
        if self.rank == 0 or "another rank refused" not in str(err):
            vllm_logger().warning("mono decode off, vLLM's decode runs: %s", err)

    def refuse_reload(self) -> None:
        if self.executor is not None:
            raise RuntimeError(
                f"{SWITCH}: weight reloads are not supported (the kernels read the loaded "
                "weights in place); restart the server to serve new weights"
            )

    # -- steps ----------------------------------------------------------------------------
    def record_batch(self, attn_metadata: Any, query_start_loc: Any) -> None:
        """The per-request query starts vLLM built `attn_metadata` from (model state)."""
        self._batch = (attn_metadata, query_start_loc)

    def meta(self, positions: Any, intermediate_tensors: Any) -> StepMeta | str:
        """This forward's StepMeta (or why it has none), from vLLM's forward context."""
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return "no forward context"
        context = get_forward_context()
        batch = self._batch
        starts = batch[1] if batch is not None and batch[0] is context.attn_metadata else None
        return step_meta(
            context,
            self.kernels.metadata_key,
            starts,
            model_rows=positions.shape[0],
            kv_bound=self.executor.bound,
            intermediate_input=intermediate_tensors is not None,
            positions_dtype=str(positions.dtype).removeprefix("torch."),
        )

    def begin(self, positions: Any, intermediate_tensors: Any) -> None:
        """Plans the forward that follows; the dispatching layers read the plan."""
        executor = self.executor
        if executor is None:
            return
        meta = self.meta(positions, intermediate_tensors)
        step = executor.plan(meta) if isinstance(meta, StepMeta) else None
        # Model Runner V2 captures a FULL graph by running the forward eagerly (graph
        # mode NONE in the forward context) inside torch.cuda.graph
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if step is not None and capturing:
            if step.width not in self._captured and self.rank == 0:
                vllm_logger().info(
                    "mono: CUDA graph of %d rows captured on the kernels", step.width
                )
            self._captured.add(step.width)

    def end(self, output: Any) -> Any:
        """Ends the forward (`MonoExecutor.finish`: the fault guard on its output)."""
        if self.executor is not None:
            self.executor.finish(output[0] if isinstance(output, tuple) else output)
        return output

    def abandon(self) -> None:
        """The forward raised: drop the plan."""
        if self.executor is not None:
            self.executor.finish()

    def after_step(self) -> None:
        if self.executor is not None:
            self.executor.after_step()
