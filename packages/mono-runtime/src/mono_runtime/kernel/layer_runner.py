"""LayerRunner: the lifecycle every runner of a layer's kernels shares.

Why a base: an engine drives every runner alike (`step_begin` once per forward,
`after_step` once per executed step, a collective `reset` after a fault, `inject` to
qualify the fault path, `close` at shutdown), and a closed runner must refuse every call
rather than touch memory it released. The base holds that contract once; a runner
implements the five `_hooks` and calls `_live()` in its own methods.
"""

from __future__ import annotations

import abc


class LayerRunner(abc.ABC):
    """Closed until the subclass's constructor calls `_opened()` (a constructor that
    raises leaves nothing usable); after `close()`, every method raises RuntimeError."""

    _closed = True
    _closed_why = ""  # what close() released, for the error's text

    def _opened(self) -> None:
        self._closed = False

    def _live(self) -> None:
        if self._closed:
            why = f" ({self._closed_why})" if self._closed_why else ""
            raise RuntimeError(f"{type(self).__name__} is closed{why}")

    @property
    def closed(self) -> bool:
        return self._closed

    def step_begin(self) -> None:
        """Once per forward, before its first launch; a CUDA/HIP graph captures it."""
        self._live()
        self._step_begin()

    def after_step(self) -> None:
        """Once per executed step, eagerly on every rank (also under graph replay): raises
        MonoFault when a launch of the step gave up a wait."""
        self._live()
        self._after_step()

    def reset(self) -> None:
        """Collective, no launch in flight: clear what a fault left; the runner is usable
        again."""
        self._live()
        self._reset()

    def inject(self, rank: int | None, delay_ns: int = 0) -> None:
        """Fault injection: `rank` stalls `delay_ns` before its first peer store in every
        launch; None turns it off. The same call on every rank."""
        self._live()
        self._inject(rank, delay_ns)

    def close(self) -> None:
        """Idempotent: release what this runner owns; every method raises afterwards."""
        if not self._closed:
            self._closed = True
            self._release()

    def __enter__(self) -> LayerRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def _step_begin(self) -> None: ...

    @abc.abstractmethod
    def _after_step(self) -> None: ...

    @abc.abstractmethod
    def _reset(self) -> None: ...

    @abc.abstractmethod
    def _inject(self, rank: int | None, delay_ns: int) -> None: ...

    @abc.abstractmethod
    def _release(self) -> None: ...
