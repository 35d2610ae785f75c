"""The StepMeta adapter: what vLLM 0.33 knows of a step, in mono_runtime's neutral terms.

It reads only what is identical on every TP rank (the scheduler's batch, broadcast to all
workers, and the attention metadata built from it): a plan that could differ between
ranks would leave some of them spinning in a kernel's mailbox.

Sources, per step:
- the forward context (`vllm.forward_context.ForwardContext`): the CUDA-graph runtime
  mode and the attention metadata by layer name;
- the metadata of one layer the kernels replace: the request split of vLLM's builders,
  either the decode/prefill split of the attention builders (``num_decodes``,
  ``num_decode_tokens``, ``num_prefills``: MiniMax-M3's sparse attention metadata and the
  FlashAttention-style ones) or the KDA/GDN split (``num_decodes``,
  ``num_spec_decodes``, ``num_prefills``);
- the per-request query starts vLLM built that metadata from (``query_start_loc_cpu`` of
  its `CommonAttentionMetadata`), recorded by the model state's ``prepare_attn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mono_runtime.planner import GraphMode, StepMeta

_GRAPH_MODES = {"NONE": GraphMode.NONE, "PIECEWISE": GraphMode.PIECEWISE, "FULL": GraphMode.FULL}


def request_split(md: Any) -> tuple[int, int, int]:
    """(prefills, plain decodes, spec-verifies) of one layer's vLLM attention metadata."""
    if hasattr(md, "num_spec_decodes"):  # GDNAttentionMetadata and its KDA subclasses
        return md.num_prefills, md.num_decodes, md.num_spec_decodes
    if hasattr(md, "num_decodes") and hasattr(md, "num_decode_tokens"):
        # vLLM's builders count a request of up to 1 + num_speculative_tokens rows as a
        # decode (uniform: a builder that requires it calls shorter ones prefills)
        if md.num_decodes and md.num_decode_tokens > md.num_decodes:
            return md.num_prefills, 0, md.num_decodes
        return md.num_prefills, md.num_decodes, 0
    raise TypeError(f"no request split in attention metadata {type(md).__name__}")


def query_lens(query_start_loc: Sequence[int], graph_mode: GraphMode) -> tuple[int, ...] | str:
    """Rows of each request, or why they cannot be served. Under a FULL graph the
    requests past the real ones are padding with no rows; the kernels serve each like a
    real request of the batch's rows (a null state block, one accepted token)."""
    starts = [int(s) for s in query_start_loc]
    lens = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    if not lens or min(lens) > 0:
        return tuple(lens)
    if graph_mode is not GraphMode.FULL:
        return "an empty request outside a FULL graph"
    rows, first_pad = max(lens), lens.index(0)
    if rows == 0 or any(lens[first_pad:]):
        return "padding requests that are not whole trailing requests"
    return tuple(n or rows for n in lens)


def step_meta(
    context: Any,
    layer_name: str,
    query_start_loc: Sequence[int] | None,
    model_rows: int,
    kv_bound: bool,
    intermediate_input: bool,
    positions_dtype: str,
) -> StepMeta | str:
    """The StepMeta of the step the forward `context` describes, or why there is none.

    `layer_name`: the metadata key of a layer the kernels replace; `query_start_loc`: the
    step's per-request starts (None when vLLM built no metadata, e.g. a profiling run);
    `model_rows`: the rows the model runs (the positions tensor's length)."""
    graph_mode = _GRAPH_MODES[context.cudagraph_runtime_mode.name]
    mds = context.attn_metadata
    md = mds.get(layer_name) if isinstance(mds, dict) else None
    if isinstance(mds, list):
        return "micro-batched step (DBO)"
    if md is None or query_start_loc is None:
        # no metadata: profiling and dummy runs, which the planner runs stock
        return StepMeta(
            num_reqs=0,
            query_lens=(),
            num_prefills=0,
            num_decodes=0,
            num_spec_verifies=0,
            kv_bound=False,
            graph_mode=graph_mode,
            has_intermediate_input=intermediate_input,
        )
    lens = query_lens(query_start_loc, graph_mode)
    if isinstance(lens, str):
        return lens
    prefills, decodes, verifies = request_split(md)
    if prefills + decodes + verifies != len(lens):
        return (
            f"metadata of {prefills + decodes + verifies} requests for a batch of "
            f"{len(lens)}: not this step's"
        )
    if sum(lens) != model_rows:
        return f"{model_rows - sum(lens)} rows outside every request (token padding)"
    return StepMeta(
        num_reqs=len(lens),
        query_lens=lens,
        num_prefills=prefills,
        num_decodes=decodes,
        num_spec_verifies=verifies,
        kv_bound=kv_bound,
        graph_mode=graph_mode,
        has_intermediate_input=intermediate_input,
        dtypes={"positions": positions_dtype},
    )
