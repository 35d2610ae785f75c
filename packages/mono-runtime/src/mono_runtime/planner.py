"""Step planning: may this step take the kernels, and which kernel replaces each layer.

Every predicate reads only `StepMeta`, which an engine adapter fills from metadata that is
identical on every rank: the kernels' mailboxes need every rank on one path, so a
decision that could differ between ranks would leave some of them spinning.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import MonoUnsupported


class GraphMode(enum.Enum):
    """How the step runs: eagerly, replayed from a piecewise graph, or from a full graph."""

    NONE = "none"
    PIECEWISE = "piecewise"
    FULL = "full"


@dataclass(frozen=True)
class StepMeta:
    """What the planner knows of a step; engine-neutral (an adapter builds it).

    `query_lens` are the rows of each request in batch order (padding requests of a FULL
    graph included). `dtypes` names the dtype of each tensor the kernels would read, e.g.
    {"hidden": "bfloat16", "positions": "int64"}.
    """

    num_reqs: int
    query_lens: tuple[int, ...]
    num_prefills: int
    num_decodes: int
    num_spec_verifies: int
    kv_bound: bool
    graph_mode: GraphMode = GraphMode.NONE
    is_first_stage: bool = True
    has_intermediate_input: bool = False
    dtypes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "query_lens", tuple(int(n) for n in self.query_lens))
        counts = (self.num_reqs, self.num_prefills, self.num_decodes, self.num_spec_verifies)
        if min(counts) < 0 or min(self.query_lens, default=1) < 1:
            raise ValueError(f"StepMeta: negative count or empty request in {self}")
        if len(self.query_lens) != self.num_reqs:
            raise ValueError(
                f"StepMeta: {len(self.query_lens)} query_lens for {self.num_reqs} requests"
            )
        if sum(counts[1:]) != self.num_reqs:
            raise ValueError(
                f"StepMeta: {self.num_prefills} prefills + {self.num_decodes} decodes + "
                f"{self.num_spec_verifies} spec-verifies != {self.num_reqs} requests"
            )
        if not isinstance(self.graph_mode, GraphMode):
            raise ValueError(f"StepMeta: graph_mode {self.graph_mode!r} is not a GraphMode")

    @property
    def rows(self) -> int:
        return sum(self.query_lens)


def step_reason(
    meta: StepMeta, width: int, q: int, dtypes: Mapping[str, str] | None = None
) -> str | None:
    """None if the kernels built for `width` rows of `q`-row requests can serve this step,
    else why not. `dtypes`: the dtype each named tensor must have (all must be present).

    q == 1 means regular decode (one row per request); q > 1 means spec-verify of q rows.
    """
    if q < 1 or width < 1:
        raise ValueError(f"step_reason: width {width} and q {q} must be >= 1")
    if meta.has_intermediate_input or not meta.is_first_stage:
        return "pipeline-parallel stage input"
    if not meta.kv_bound:
        return "no KV cache bound (profiling or dummy run)"
    if meta.graph_mode is GraphMode.PIECEWISE:
        return "PIECEWISE graph (captured without attention metadata)"
    if meta.num_reqs == 0:
        return "no requests"
    if meta.num_prefills:
        return f"{meta.num_prefills} prefill request(s)"
    if q == 1 and meta.num_spec_verifies:
        return f"{meta.num_spec_verifies} spec-verify request(s) in a decode deployment"
    if q > 1 and meta.num_decodes:
        return f"{meta.num_decodes} plain decode request(s) in a spec-verify deployment"
    if any(n != q for n in meta.query_lens):
        return f"request rows {sorted(set(meta.query_lens))} are not uniformly {q}"
    if meta.rows != width:
        return f"{meta.rows} rows, kernel width {width}"
    for name, want in (dtypes or {}).items():
        have = meta.dtypes.get(name)
        if have != want:
            return f"{name} is {have or 'unknown'}, kernels need {want}"
    return None


@dataclass(frozen=True)
class Step:
    """A planned step of `width` rows; `kernels` maps a decoder layer to its kernel."""

    width: int
    kernels: Mapping[int, Callable[..., Any]]

    def layer(self, i: int) -> Callable[..., Any] | None:
        """The kernel replacing decoder layer `i` in this step, or None (the engine's)."""
        return self.kernels.get(i)


def plan(
    meta: StepMeta,
    kernels: Mapping[int, Mapping[int, Callable[..., Any]]],
    q: int,
    dtypes: Mapping[str, str] | None = None,
) -> Step | None:
    """This step's plan, or None to run the engine's layers.

    `kernels[width][layer]` are the built kernels. The step runs the engine's layers when
    `step_reason` refuses it or when no kernel has its width (more requests than the
    deployment's maximum). Under FULL graphs call this at capture: the plan is baked in.
    """
    by_layer = kernels.get(meta.rows)
    if by_layer is None:
        return None
    if step_reason(meta, meta.rows, q, dtypes) is not None:
        return None
    return Step(meta.rows, by_layer)


def agree(reasons: Sequence[str], group: Any, what: str) -> None:
    """Raise `MonoUnsupported` on every rank of `group` if any rank has `reasons`.

    A rank that refused alone would leave the others spinning in-kernel. `group` is a CPU
    (gloo) process group, or None for a single rank."""
    from mono_peer import tp_agree

    if not tp_agree(not reasons, group):
        why = "; ".join(reasons) if reasons else "another rank refused"
        raise MonoUnsupported(f"mono does not support {what}: {why}")
