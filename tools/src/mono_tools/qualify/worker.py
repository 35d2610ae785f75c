"""The per-rank side of `mono qualify`: run the planned checks in lockstep and report each."""

from __future__ import annotations

import time
import traceback

from mono_tools.qualify.checks import BY_NAME
from mono_tools.qualify.context import CheckFailed, RankContext, Skipped
from mono_tools.ranks import Reporter


def _device(rank: int, backend: str):
    import torch

    if backend == "host":
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def run_checks(rank: int, world: int, group, reporter: Reporter, payload: dict) -> None:
    ctx = RankContext(
        rank=rank,
        world=world,
        backend=payload["backend"],
        device=_device(rank, payload["backend"]),
        group=group,
        force_fault=payload.get("force_fault", False),
    )
    plan = [BY_NAME[name] for name in payload["checks"]]
    for check in plan:
        if check.prepare is not None:
            check.prepare(ctx)
    for check in plan:
        name = check.name
        ctx.barrier()  # every rank starts a check together: its collectives need all of them
        ctx.info = {}
        reporter.send("start", step=name)
        started = time.monotonic()
        try:
            status, detail = "pass", check.run(ctx)
        except Skipped as exc:
            status, detail = "skip", str(exc)
        except CheckFailed as exc:
            status, detail = "fail", str(exc)
        except Exception as exc:  # noqa: BLE001 - any error is this check's failure, shown
            status, detail = "fail", f"{type(exc).__name__}: {exc}"
            ctx.info["traceback"] = traceback.format_exc()
        reporter.send(
            "end",
            step=name,
            status=status,
            detail=detail,
            seconds=time.monotonic() - started,
            info=ctx.info,
        )
