"""What this machine offers (GPUs, their vendor) and which backend and rank count a command
may use on it, refused up front with a reason rather than failing inside a worker."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from mono_tools.errors import UsageError

BACKENDS = ("auto", "cuda", "hip", "host")


@dataclass(frozen=True)
class Machine:
    gpus: int  # visible to torch
    vendor: str | None  # "cuda" | "hip" | None without a GPU
    gpu_name: str | None
    cpus: int
    torch: str
    triton: str | None

    def as_dict(self) -> dict:
        return asdict(self)


def detect() -> Machine:
    """Look at the machine through torch, the way every worker will see it."""
    from importlib import metadata

    import torch

    try:  # not imported: the ranks must be the first to import triton, with their own env
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    vendor = None
    name = None
    if gpus:
        vendor = "hip" if torch.version.hip is not None else "cuda"
        name = torch.cuda.get_device_name(0)
    return Machine(
        gpus=gpus,
        vendor=vendor,
        gpu_name=name,
        cpus=os.cpu_count() or 1,
        torch=torch.__version__,
        triton=triton_version,
    )


def resolve_backend(requested: str, machine: Machine) -> str:
    """The backend to use: `auto` takes the GPU's vendor, else the host backend."""
    if requested == "auto":
        return machine.vendor or "host"
    if requested == "host":
        return "host"
    if machine.vendor is None:
        raise UsageError(f"backend {requested!r} needs a GPU, and torch sees none on this machine")
    if requested != machine.vendor:
        raise UsageError(
            f"backend {requested!r} is not available: this machine's GPUs are "
            f"{machine.vendor} ({machine.gpu_name})"
        )
    return requested


def resolve_ranks(requested: int | None, backend: str, machine: Machine, host_default: int) -> int:
    """One process per GPU on a GPU backend (all of them by default); any count on the host."""
    if backend == "host":
        ranks = host_default if requested is None else requested
    else:
        ranks = machine.gpus if requested is None else requested
        if ranks > machine.gpus:
            raise UsageError(
                f"--ranks {ranks} needs {ranks} GPUs (one process per GPU), "
                f"but torch sees {machine.gpus}"
            )
    if ranks < 1:
        raise UsageError(f"--ranks must be at least 1, got {ranks}")
    return ranks


def require_gpu(machine: Machine, what: str) -> None:
    if not machine.gpus:
        raise UsageError(
            f"{what} needs an NVIDIA or AMD GPU, and torch sees none on this machine "
            f"(`mono qualify` runs without one)"
        )
