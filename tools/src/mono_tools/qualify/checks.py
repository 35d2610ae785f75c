"""The checks of `mono qualify`, in the order they run. Each is a function of one rank's
context that calls the packages' public API, returns a one-line detail when the machine
passes, and raises `CheckFailed` (or anything) when it does not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mono_tools.qualify.context import CheckFailed, RankContext


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[RankContext], str]
    what: str  # one line for the README and --list
    timeout_s: float = 120.0  # the parent gives up on a rank silent for longer: a hang
    gpu_only: bool = False


def ranks(ctx: RankContext) -> str:
    """Every rank sees the same world and the same backend, and no two share a GPU."""
    import torch

    name = torch.cuda.get_device_name(ctx.device) if ctx.gpu else "cpu"
    seen = ctx.gather((ctx.rank, ctx.backend, str(ctx.device), name))
    if [s[0] for s in seen] != list(range(ctx.world)):
        raise CheckFailed(f"ranks out of order: {[s[0] for s in seen]}")
    if len({s[1] for s in seen}) != 1:
        raise CheckFailed(f"ranks disagree on the backend: {[s[1] for s in seen]}")
    devices = [s[2] for s in seen]
    if ctx.gpu and len(set(devices)) != ctx.world:
        raise CheckFailed(f"two ranks share a GPU: {devices}")
    names = sorted({s[3] for s in seen})
    return f"{ctx.world} ranks on {', '.join(names)}"


CHECKS: tuple[Check, ...] = (
    Check("ranks", ranks, "every rank joined one group, one GPU each", timeout_s=60),
)
BY_NAME = {check.name: check for check in CHECKS}
