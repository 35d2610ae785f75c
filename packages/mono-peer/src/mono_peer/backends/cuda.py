"""CUDA backend: cudaMalloc'd memory shared through CUDA IPC, via cuda-bindings.

Works with cuda-bindings 12.x and 13.x: both have ``cuda.bindings.runtime`` whose calls
return a tuple, error first. The IPC handle travels as its 64 raw bytes, read and written
through the struct's ``getPtr()`` (13.x no longer exposes the ``reserved`` field).
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import torch

from . import DeviceBackend, device_bytes

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


def _runtime() -> Any:
    try:
        from cuda.bindings import runtime
    except ImportError:  # cuda-python before 12.6 named the module cuda.cudart
        from cuda import cudart as runtime
    return runtime


class CudaBackend(DeviceBackend):
    name = "cuda"

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes = nbytes
        torch.cuda.init()  # a clear error without a GPU; the runtime shares its primary context
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self._rt = _runtime()

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Run one runtime call on this backend's device; raise with the CUDA error name."""
        with torch.cuda.device(self.device):
            err, *values = self._rt.cudaSetDevice(self.device.index)
            if err == self._rt.cudaError_t.cudaSuccess:
                err, *values = fn(*args)
        if err != self._rt.cudaError_t.cudaSuccess:
            _, name = self._rt.cudaGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else name
            raise RuntimeError(f"{what} failed: {name} ({int(err)})")
        return values[0] if values else None

    def allocate(self) -> tuple[int, bytes]:
        rt = self._rt
        address = int(self._call("cudaMalloc", rt.cudaMalloc, self.nbytes))
        try:
            self._call("cudaMemset", rt.cudaMemset, address, 0, self.nbytes)
            self._call("cudaDeviceSynchronize", rt.cudaDeviceSynchronize)
            handle = self._call("cudaIpcGetMemHandle", rt.cudaIpcGetMemHandle, address)
        except BaseException:
            with contextlib.suppress(Exception):
                self.free(address)
            raise
        return address, ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)

    def open(self, handle: bytes | str) -> int:
        if not isinstance(handle, bytes) or len(handle) != IPC_HANDLE_SIZE:
            raise ValueError(f"not a CUDA IPC handle ({IPC_HANDLE_SIZE} bytes): {handle!r}")
        ipc = self._rt.cudaIpcMemHandle_t()
        ctypes.memmove(ipc.getPtr(), handle, IPC_HANDLE_SIZE)
        opened = self._call(
            "cudaIpcOpenMemHandle", self._rt.cudaIpcOpenMemHandle, ipc, LAZY_ENABLE_PEER_ACCESS
        )
        return int(opened)

    def exchanged(self) -> None:
        """Nothing to drop: a CUDA IPC handle names live memory, not a file."""

    def close_peer(self, address: int) -> None:
        self._call("cudaIpcCloseMemHandle", self._rt.cudaIpcCloseMemHandle, address)

    def free(self, address: int) -> None:
        self._call("cudaFree", self._rt.cudaFree, address)

    def view(self, address: int) -> torch.Tensor:
        return device_bytes(address, self.nbytes, self.device)
