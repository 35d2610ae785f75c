"""HIP backend: uncached device memory shared through HIP IPC, via ctypes.

``hipExtMallocWithFlags(..., hipDeviceMallocUncached)`` so that a kernel polling a
mailbox in its own buffer sees a peer GPU's stores without cache maintenance. The HIP
runtime is the one torch already loaded (a second copy would keep its own device state);
it is bound on first use, so the package imports anywhere.

Not executed here (no AMD GPU in CI or on the NVIDIA test machine): every signature and
constant below was checked against the HIP API reference (hip_runtime_api.h); the tests
that run it are marked ``rocm``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import torch

from . import DeviceBackend, device_bytes

HIP_SUCCESS = 0
HIP_DEVICE_MALLOC_UNCACHED = 0x3  # hipDeviceMallocUncached
HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1  # hipIpcMemLazyEnablePeerAccess
HIP_IPC_HANDLE_SIZE = 64


class HipIpcMemHandle(ctypes.Structure):
    """hipIpcMemHandle_t: ``struct { char reserved[HIP_IPC_HANDLE_SIZE]; }``."""

    _fields_ = [("reserved", ctypes.c_char * HIP_IPC_HANDLE_SIZE)]


_VOID_PP = ctypes.POINTER(ctypes.c_void_p)
# name -> argument types; every one returns hipError_t (an int enum).
_SIGNATURES = {
    "hipSetDevice": [ctypes.c_int],
    "hipExtMallocWithFlags": [_VOID_PP, ctypes.c_size_t, ctypes.c_uint],
    "hipMemset": [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t],
    "hipDeviceSynchronize": [],
    "hipIpcGetMemHandle": [ctypes.POINTER(HipIpcMemHandle), ctypes.c_void_p],
    "hipIpcOpenMemHandle": [_VOID_PP, HipIpcMemHandle, ctypes.c_uint],  # handle by value
    "hipIpcCloseMemHandle": [ctypes.c_void_p],
    "hipFree": [ctypes.c_void_p],
}


def loaded_library_path(maps: str = "/proc/self/maps") -> str:
    """Path of the libamdhip64 already mapped into this process, else the plain soname."""
    with open(maps) as lines:
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(
                "libamdhip64.so"
            ):
                return fields[5].strip()
    return "libamdhip64.so"


@functools.cache
def _hip() -> ctypes.CDLL:
    torch.cuda.init()  # torch loads and initializes its HIP runtime first
    lib = ctypes.CDLL(loaded_library_path())
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.hipGetErrorName.argtypes = [ctypes.c_int]
    lib.hipGetErrorName.restype = ctypes.c_char_p
    return lib


class HipBackend(DeviceBackend):
    name = "hip"

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes = nbytes
        self._lib = _hip()
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)

    def _call(self, name: str, *args: object) -> None:
        """Run one HIP call on this backend's device; raise with the HIP error name."""
        with torch.cuda.device(self.device):
            err = self._lib.hipSetDevice(self.device.index)
            if err == HIP_SUCCESS:
                err = getattr(self._lib, name)(*args)
        if err != HIP_SUCCESS:
            raise RuntimeError(f"{name} failed: {self._lib.hipGetErrorName(err).decode()} ({err})")

    def allocate(self) -> tuple[int, bytes]:
        pointer = ctypes.c_void_p()
        self._call(
            "hipExtMallocWithFlags", ctypes.byref(pointer), self.nbytes, HIP_DEVICE_MALLOC_UNCACHED
        )
        if not pointer.value:
            raise RuntimeError("hipExtMallocWithFlags returned a null pointer")
        address = int(pointer.value)
        try:
            self._call("hipMemset", address, 0, self.nbytes)
            self._call("hipDeviceSynchronize")
            handle = HipIpcMemHandle()
            self._call("hipIpcGetMemHandle", ctypes.byref(handle), address)
        except BaseException:
            with contextlib.suppress(Exception):
                self.free(address)
            raise
        return address, bytes(handle)

    def open(self, handle: bytes | str) -> int:
        if not isinstance(handle, bytes) or len(handle) != HIP_IPC_HANDLE_SIZE:
            raise ValueError(f"not a HIP IPC handle ({HIP_IPC_HANDLE_SIZE} bytes): {handle!r}")
        ipc = HipIpcMemHandle.from_buffer_copy(handle)
        pointer = ctypes.c_void_p()
        self._call(
            "hipIpcOpenMemHandle", ctypes.byref(pointer), ipc, HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        )
        return int(pointer.value)

    def exchanged(self) -> None:
        """Nothing to drop: a HIP IPC handle names live memory, not a file."""

    def close_peer(self, address: int) -> None:
        self._call("hipIpcCloseMemHandle", address)

    def free(self, address: int) -> None:
        self._call("hipFree", address)

    def view(self, address: int) -> torch.Tensor:
        return device_bytes(address, self.nbytes, self.device)
