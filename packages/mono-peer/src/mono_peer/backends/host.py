"""Host backend: POSIX shared memory, one segment per rank, mapped by every rank.

It makes peer memory (and every in-kernel collective built on it) testable on a CPU
with real processes: the addresses are this process's virtual addresses, so ctypes,
torch and Triton under TRITON_INTERPRET=1 can load and store through them. Linux only
(segments live in /dev/shm). A segment is unlinked as soon as every rank has opened it
or given up, so a rank killed later leaves nothing behind; its name is chosen and shared
before it exists (`reserve`), so the survivors of a rank killed mid-construction remove it
(`remove`). A handle is a segment name, never a path: a peer's handle cannot reach
another file.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import secrets

import torch

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "mono-peer-"
SEGMENT_NAME = re.compile(r"mono-peer-[0-9]+-r[0-9]+-[0-9a-f]{12}")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, nbytes: int) -> int:
    addr = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {nbytes} bytes failed: {os.strerror(err)}")
    return int(addr)


def _unmap(address: int, nbytes: int) -> None:
    if _libc.munmap(address, nbytes) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap failed: {os.strerror(err)}")


class HostBackend:
    name = "host"
    device = torch.device("cpu")

    def __init__(self, nbytes: int, rank: int) -> None:
        self.nbytes = nbytes
        self.rank = rank
        self._name = f"{SEGMENT_PREFIX}{os.getpid()}-r{rank}-{secrets.token_hex(6)}"
        self._segment: str | None = None  # our own segment until it is unlinked

    def _path(self, segment: str) -> str:
        if not isinstance(segment, str) or not SEGMENT_NAME.fullmatch(segment):
            raise ValueError(f"not a host peer handle (a {SEGMENT_PREFIX}* name): {segment!r}")
        return os.path.join(SHM_DIR, segment)

    def reserve(self) -> str:
        """The name `allocate` will create, for peers to remove should this rank die."""
        return self._name

    def remove(self, names: list[str | None]) -> None:
        """Unlink the segments peers reserved (a rank killed before its unlink leaves one)."""
        for name in names:
            if name is not None:
                with contextlib.suppress(FileNotFoundError, ValueError):
                    os.unlink(self._path(name))

    def allocate(self) -> tuple[int, str]:
        segment = self._name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(self._path(segment), flags, 0o600)
        self._segment = segment
        try:
            os.ftruncate(fd, self.nbytes)  # a fresh segment reads as zeros
            os.posix_fallocate(fd, 0, self.nbytes)  # a full /dev/shm fails here, not as SIGBUS
            address = _map(fd, self.nbytes)
        except BaseException:
            self.exchanged()
            raise
        finally:
            os.close(fd)
        return address, segment

    def open(self, handle: bytes | str) -> int:
        fd = os.open(self._path(handle), os.O_RDWR | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size != self.nbytes:
                raise OSError(f"segment {handle} holds {size} bytes, expected {self.nbytes}")
            return _map(fd, self.nbytes)
        finally:
            os.close(fd)

    def exchanged(self) -> None:
        self.remove([self._segment])
        self._segment = None

    def close_peer(self, address: int) -> None:
        _unmap(address, self.nbytes)

    def free(self, address: int) -> None:
        self.exchanged()
        _unmap(address, self.nbytes)

    def view(self, address: int) -> torch.Tensor:
        raw = (ctypes.c_uint8 * self.nbytes).from_address(address)
        return torch.frombuffer(raw, dtype=torch.uint8)
