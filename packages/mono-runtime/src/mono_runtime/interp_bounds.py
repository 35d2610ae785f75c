"""Out-of-bounds checks for kernels run by Triton's CPU interpreter (TRITON_INTERPRET=1).

Why: under the interpreter a load, store or atomic outside every tensor reads or writes
whatever host memory lies there, silently, so a kernel can pass its CPU tests and die
on a GPU with "an illegal memory access" (or corrupt a neighbour without a trace).
`checking()` wraps the interpreter's memory operations: every address an unmasked lane
touches (its whole element) must lie in a known range, the launches' tensor arguments
and whatever the caller `allow`s (memory reached through addresses passed as integers or
read from tables: peer buffers, pointer tables' targets). Each access outside them is
recorded with the kernel source line that made it; the first one raises at once unless
`record_only`.

    with checking(extra_tensor, (addr, nbytes)) as b:
        kernel[grid](...)
    assert not b.violations
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class OutOfBounds(AssertionError):
    """An interpreted kernel touched memory outside every allowed range."""


@dataclass
class Violation:
    op: str  # "load", "store", "atomic"
    address: int
    nbytes: int
    where: str  # file:line of the kernel source (innermost frame outside Triton)
    line: str

    def __str__(self) -> str:
        return f"{self.op} of {self.nbytes} bytes at {self.address:#x}: {self.where}: {self.line}"


@dataclass
class Bounds:
    """Allowed [start, end) byte ranges and the accesses found outside them."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    record_only: bool = False

    def allow(self, what: Any, nbytes: int | None = None) -> None:
        """A tensor (the bytes its elements span: a view allows only itself), or an
        address with `nbytes`."""
        if hasattr(what, "data_ptr"):
            span = sum((n - 1) * abs(s) for n, s in zip(what.shape, what.stride(), strict=True))
            start, nbytes = what.data_ptr(), (span + 1) * what.element_size() * (what.numel() > 0)
        else:
            start = int(what)
        if nbytes:
            self.ranges.append((start, start + int(nbytes)))

    def check(self, op: str, ptrs: np.ndarray, mask: np.ndarray | None, itemsize: int) -> None:
        addr = np.asarray(ptrs, dtype=np.uint64).reshape(-1)
        if mask is not None:
            addr = addr[np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape).reshape(-1)]
        if addr.size == 0:
            return
        bad = np.ones(addr.shape, dtype=bool)
        for lo, hi in self.ranges:
            bad &= ~((addr >= np.uint64(lo)) & (addr + np.uint64(itemsize) <= np.uint64(hi)))
        if not bad.any():
            return
        where, line = _kernel_frame()
        v = Violation(op, int(addr[bad][0]), itemsize, where, line)
        self.violations.append(v)
        if not self.record_only:
            raise OutOfBounds(str(v))


def _kernel_frame() -> tuple[str, str]:
    """The innermost frame outside Triton (and its generated wrappers) and this module: the
    kernel's source line."""
    for f in reversed(traceback.extract_stack()):
        name = f.filename.replace("\\", "/")
        if "/triton/" in name or name.startswith("<") or f.filename == __file__:
            continue
        return f"{f.filename}:{f.lineno}", (f.line or "").strip()
    return "?", ""


class _Checked:
    """Stands in for triton._C.libtriton.interpreter in Triton's interpreter module."""

    def __init__(self, real: Any, bounds: Bounds) -> None:
        self._real, self._b = real, bounds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load(self, ptrs, mask, other, dtype):
        self._b.check("load", ptrs, mask, np.dtype(dtype).itemsize)
        return self._real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        self._b.check("store", ptrs, mask, value.dtype.itemsize)
        return self._real.store(ptrs, value, mask)

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        self._b.check("atomic", ptrs, mask, value.dtype.itemsize)
        return self._real.atomic_rmw(op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        self._b.check("atomic", ptrs, None, cmp.dtype.itemsize)
        return self._real.atomic_cas(ptrs, cmp, value, sem)


@contextlib.contextmanager
def checking(*allowed: Any, record_only: bool = False) -> Iterator[Bounds]:
    """Check every interpreted memory access inside the block. `allowed`: tensors, or
    (address, nbytes) pairs; each launch's tensor arguments are allowed from its launch on."""
    from triton.runtime import interpreter as it

    bounds = Bounds(record_only=record_only)
    for a in allowed:
        if isinstance(a, tuple):
            bounds.allow(*a)
        else:
            bounds.allow(a)
    real, call = it._interpreter, it.GridExecutor._init_args_hst

    def init_args(self, args, kwargs):
        hst = call(self, args, kwargs)
        for a in list(hst[0]) + list(hst[1].values()):
            if hasattr(a, "data_ptr"):
                bounds.allow(a)
        return hst

    it._interpreter, it.GridExecutor._init_args_hst = _Checked(real, bounds), init_args
    try:
        yield bounds
    finally:
        it._interpreter, it.GridExecutor._init_args_hst = real, call
