"""tp_agree: the one collective that keeps every rank on the same decision.

A rank that acts alone on a local outcome (a failed open, a bad argument) strands the
peers waiting for it in the next collective; deciding with a MIN all-reduce first makes
every rank take the same branch.
"""

from __future__ import annotations

from typing import Any


def tp_agree(ok: bool, group: Any) -> bool:
    """True when every rank of the CPU (gloo) ``group`` passed True; ``None`` means one rank."""
    if group is None:
        return bool(ok)
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def agree_min(values: list[int], group: Any) -> list[int]:
    """Element-wise MIN of small integer vectors over ``group`` (identity for one rank)."""
    if group is None:
        return list(values)
    import torch
    import torch.distributed as dist

    vec = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(vec, op=dist.ReduceOp.MIN, group=group)
    return [int(v) for v in vec.tolist()]
