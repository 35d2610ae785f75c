"""What a check sees on its rank: who it is, its device and group, and the few collective
helpers checks share (agreement, bit-identical comparison across ranks)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


class Skipped(Exception):
    """The check does not apply on this machine (say why); shown as `skip`, not a failure."""


class CheckFailed(Exception):
    """The check ran and found the machine wrong; the message is what the user reads."""


@dataclass
class RankContext:
    rank: int
    world: int
    backend: str  # "cuda" | "hip" | "host"
    device: Any  # torch.device
    group: Any  # the gloo process group of every rank
    force_fault: bool = False  # testing only: make the all-reduce check meet a real fault
    info: dict = field(default_factory=dict)  # extra per-rank facts for the JSON report
    background: dict = field(default_factory=dict)  # work checks start early (compiles)

    @property
    def gpu(self) -> bool:
        return self.backend != "host"

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (gloo, bounded by the group timeout)."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def digest(self, tensor: Any) -> str:
        """A hash of the tensor's exact bytes: equal digests mean bit-identical tensors."""
        import torch

        raw = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8)
        return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]

    def same_on_every_rank(self, tensor: Any) -> bool:
        digests = self.gather(self.digest(tensor))
        return len(set(digests)) == 1
