"""The two errors of mono: a refusal before any launch, and an in-kernel wait that gave up.

Both are raised on every rank (through `agree` and `after_step`), because a rank that
raised alone would leave its peers spinning in a collective.
"""

from __future__ import annotations


class MonoUnsupported(RuntimeError):
    """A step, build or deployment that mono cannot serve; the engine's own path runs instead."""


class MonoFault(RuntimeError):
    """Some rank gave up an in-kernel wait; `timeline` says who waited for what, and when."""

    def __init__(self, message: str, timeline: str = "") -> None:
        super().__init__(f"{message}\n{timeline}" if timeline else message)
        self.timeline = timeline
