"""The executor: one model's layer kernels on one rank, from build to the last step.

Engine-free (it imports no vLLM), so the same object runs under vLLM and in the GPU test
that compares a model on the kernels with the same model on reference layers:

- `MonoExecutor.build` checks the loaded layers, builds the rank's `MonoRunner` and the
  layer kernels of every width, and compiles and warms every build (before memory
  profiling and graph capture). Every refusal is agreed on all ranks.
- `prepare_kv` binds it to the KV cache the engine just bound (each one it allocates).
- `plan(meta)` decides the step (`mono_runtime.planner.plan`) and bumps the step's epoch;
  `layer(i)` is then the kernel replacing decoder layer i, or None; `finish(hidden)`
  ends it (and poisons `hidden` if any rank gave up).
- `after_step()` runs once per executed step on every rank (eager, also after a graph
  replay) and raises `MonoFault` on every rank once any rank gave up an in-kernel wait.

The model-specific part is a `LayerKernels` object (one per model: MiniMax-M3's FFN
kernels, Kimi-K3's K1 kernels; later kernels plug in the same way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

from mono_runtime.errors import MonoUnsupported
from mono_runtime.planner import Step, StepMeta, agree, plan

log = logging.getLogger(__name__)

Kernel = Callable[..., Any]


class LayerKernels(Protocol):
    """One model's kernels over its loaded decoder layers."""

    name: str  # for messages, e.g. "MiniMax-M3 FFN"
    layers: Sequence[int]  # the decoder layers a kernel replaces
    dtypes: Mapping[str, str]  # dtypes the kernels need in StepMeta.dtypes
    notes: Sequence[str]  # what `build` did that an operator should know (memory it took)

    def check(self) -> list[str]:
        """Why the loaded layers cannot run on the kernels (shapes, formats, TP)."""

    def runner_bytes(self, widths: Sequence[int]) -> tuple[int, int]:
        """(scratch, peer) bytes the rank's runner needs for every build at these widths."""

    def build(self, runner: Any, widths: Sequence[int]) -> Mapping[int, Mapping[int, Kernel]]:
        """The compiled, warmed kernel of each layer at each width: ``[width][layer]``."""

    def step_begin(self, runner: Any) -> None:
        """Once per forward on the kernels, before its first launch (a graph captures it):
        bumps the runner's step epoch exactly once, and resets per-step launch state."""

    def kv_key(self) -> Hashable | None:
        """What identifies the KV caches the kernels read as bound (addresses, not slot
        counts: an extensible cache re-binds its views with a final block count); None
        while none is bound."""

    def kv_check(self) -> list[str]:
        """Why the bound KV caches cannot be read by the kernels."""

    def close(self) -> None:
        """Releases what `build` made."""


class MonoExecutor:
    """A built executor; construct it with `build`."""

    def __init__(
        self,
        kernels: LayerKernels,
        runner: Any,
        table: Mapping[int, Mapping[int, Kernel]],
        q: int,
        group: Any,
    ) -> None:
        self.kernels, self.runner, self.table, self.q, self.group = kernels, runner, table, q, group
        self.current: Step | None = None
        self._kv: Hashable | None = None
        self._closed = False

    @classmethod
    def build(
        cls,
        kernels: LayerKernels,
        *,
        q: int,
        widths: Sequence[int],
        group: Any,
        make_runner: Callable[[int, int], Any],
        reasons: Sequence[str] = (),
    ) -> MonoExecutor:
        """Checks, builds and warms on every rank of `group`, or raises `MonoUnsupported`
        on every rank. `reasons`: the caller's own refusals (the deployment's);
        `make_runner(scratch_bytes, peer_bytes)` builds the rank's runner (collective)."""
        widths = sorted(set(widths))
        if not widths or widths[0] < 1 or any(w % q for w in widths):
            raise ValueError(f"widths {widths} must be positive multiples of q={q}")
        agree([*reasons, *kernels.check()], group, f"this deployment ({kernels.name})")
        runner = make_runner(*kernels.runner_bytes(widths))
        table: Mapping[int, Mapping[int, Kernel]] = {}
        failure: list[str] = []
        try:
            table = kernels.build(runner, widths)
            if sorted(table) != widths:
                raise ValueError(f"built widths {sorted(table)}, asked for {widths}")
        except MonoUnsupported as err:
            failure = [str(err)]
        except Exception as err:  # a local failure must not strand the peers in agree
            log.exception("mono: building %s kernels failed", kernels.name)
            failure = [f"{type(err).__name__}: {err}"]
        try:
            agree(failure, group, f"the {kernels.name} kernel builds")
        except MonoUnsupported:
            kernels.close()
            runner.close()
            raise
        return cls(kernels, runner, table, q, group)

    @property
    def widths(self) -> list[int]:
        return sorted(self.table)

    @property
    def bound(self) -> bool:
        return self._kv is not None

    def prepare_kv(self) -> None:
        """Binds the KV caches the engine just bound; raises `MonoUnsupported` on every
        rank if the kernels cannot read them."""
        self._kv = None
        key = self.kernels.kv_key()
        agree(self.kernels.kv_check() if key is not None else [], self.group, "the KV caches")
        self._kv = key

    def plan(self, meta: StepMeta) -> Step | None:
        """This step's plan (None: the engine's layers), held until `finish`. Under FULL
        graphs it runs at capture only, and the plan is baked into the graph."""
        if self._closed:
            return None
        step = plan(meta, self.table, self.q, self.kernels.dtypes)
        if step is not None:
            if self.kernels.kv_key() != self._kv:
                raise RuntimeError(
                    f"mono ({self.kernels.name}): the KV cache was re-bound without "
                    "prepare_kv (the model state's initialize_kv_cache)"
                )
            self.kernels.step_begin(self.runner)
        self.current = step
        return step

    def layer(self, index: int) -> Kernel | None:
        """The kernel replacing decoder layer `index` in the current step, or None."""
        return None if self.current is None else self.current.layer(index)

    def finish(self, hidden: Any = None) -> None:
        """Ends the step. After a step on the kernels, `hidden` (the layer loop's output)
        is poisoned with NaN on the device when any rank gave up (a FULL graph captures
        it), so a failed step yields no finite logits even before `after_step` sees it."""
        step, self.current = self.current, None
        if step is not None and hidden is not None:
            self.runner.guard(hidden)

    def after_step(self) -> None:
        """Raises `MonoFault` on every rank once any rank gave up an in-kernel wait."""
        if not self._closed:
            self.runner.after_step()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.current = None
        self.kernels.close()
        self.runner.close()
