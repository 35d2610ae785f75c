"""The per-item timeline of a `timeline=True` FFN build: which program ran which item
when, by stage (mono_runtime.timeline tabulates and plots it).

A timeline build stamps the device clock (ns) at each ticket's start, ready (its waits
over) and end into its scratch (`spec.scratch_layout`'s `timeline`); `FfnRunner.timeline(s)`
reads width s's last launch. Stages come from the ticket order of `spec.TaskPlan` and the
launch's slot count.
"""

from __future__ import annotations

import torch
from mono_runtime.timeline import from_stamps, read_stamps

from .spec import FfnBuild, stage_bounds


def items(region: torch.Tensor, b: FfnBuild, nslots: int, final: bool) -> list[dict]:
    """One row per item of the launch (mono_runtime.timeline's rows), from the build's
    timeline region (its bytes)."""
    bounds = stage_bounds(b, nslots, final)
    return from_stamps(
        read_stamps(region, bounds[-1][2]),
        lambda t: next(name for name, lo, hi in bounds if lo <= t < hi),
    )
