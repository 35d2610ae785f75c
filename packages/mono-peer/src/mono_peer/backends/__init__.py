"""Peer-memory backends: allocate, export, open and free one rank's buffer.

Each backend module is imported only when picked, so the package imports anywhere
(no HIP runtime or CUDA driver needed to use the host backend).
"""

from __future__ import annotations

from typing import Protocol

import torch

BACKENDS = ("cuda", "hip", "host")


class Backend(Protocol):
    """One rank's side of a peer buffer of ``nbytes``; PeerBuffer drives the collective part."""

    name: str
    device: torch.device  # normalized (a GPU index filled in)

    def reserve(self) -> str | None:
        """What peers must remove should this rank die mid-construction (a name), or None."""
        ...

    def remove(self, names: list[str | None]) -> None:
        """Remove what dead peers reserved and left behind (after a failed construction)."""
        ...

    def allocate(self) -> tuple[int, bytes | str]:
        """Allocate and zero the local buffer; return (address, handle that peers can open)."""
        ...

    def open(self, handle: bytes | str) -> int:
        """Map a peer's buffer from its handle; return its address in this process."""
        ...

    def exchanged(self) -> None:
        """Every rank has finished opening (or given up); drop what only the exchange needed."""
        ...

    def close_peer(self, address: int) -> None:
        """Unmap a peer buffer opened by :meth:`open`."""
        ...

    def free(self, address: int) -> None:
        """Free the local buffer returned by :meth:`allocate`."""
        ...

    def view(self, address: int) -> torch.Tensor:
        """A non-owning uint8 tensor over the local buffer."""
        ...


class DeviceBackend:
    """What the GPU backends share: their memory dies with its process, nothing to reserve."""

    def reserve(self) -> None:
        return None

    def remove(self, names: list[str | None]) -> None:
        """Nothing to remove: a dead process's device memory is freed by the driver."""


def default_backend(device: torch.device) -> str:
    """The backend a device gets unless the caller overrides it."""
    if device.type == "cpu":
        return "host"
    if device.type == "cuda":
        return "hip" if torch.version.hip else "cuda"
    raise ValueError(f"PeerBuffer: no peer-memory backend for device {device}")


def device_problem(name: str, device: torch.device) -> str | None:
    """Why ``device`` cannot use backend ``name``, or None (decided from arguments alone)."""
    if name not in BACKENDS:
        return f"unknown backend {name!r} (choose one of {', '.join(BACKENDS)})"
    if name == "host" and device.type != "cpu":
        return f"backend 'host' needs a cpu device, got {device}"
    if name in ("cuda", "hip") and device.type != "cuda":
        return f"backend {name!r} needs a cuda device (torch's name for a GPU), got {device}"
    if name == "cuda" and torch.version.hip:
        return "backend 'cuda' needs a CUDA build of torch; this one is built for ROCm"
    if name == "hip" and not torch.version.hip:
        return "backend 'hip' needs a ROCm build of torch; this one is not"
    return None


def make_backend(name: str, nbytes: int, device: torch.device, rank: int) -> Backend:
    """Instantiate backend ``name`` (already validated by :func:`device_problem`)."""
    if name == "host":
        from .host import HostBackend

        return HostBackend(nbytes, rank)
    if name == "cuda":
        from .cuda import CudaBackend

        return CudaBackend(nbytes, device)
    from .hip import HipBackend

    return HipBackend(nbytes, device)


class _DeviceMemory:
    """Raw device memory offered to torch through ``__cuda_array_interface__``; owns nothing."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def device_bytes(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A non-owning uint8 tensor over ``nbytes`` of GPU memory at ``address``."""
    return torch.as_tensor(_DeviceMemory(address, nbytes), device=device)
