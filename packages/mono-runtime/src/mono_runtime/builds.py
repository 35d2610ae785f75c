"""Builds: a frozen key per kernel variant, hashed with the kernel's source, backend and
target; a compile cache; warm-up of every variant; and the residency check.

A kernel that waits on other programs of its own launch without a ticket order needs its
whole grid resident at once; `residency_problem` refuses such a grid, with the limit that
binds, from the compiled kernel's registers, shared memory and threads.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import subprocess
import tempfile
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def source_hash(fn: Any) -> str:
    """A hash of a Triton kernel's source and every jit function it calls (Triton's own
    `cache_key`); under the interpreter, of the source of the kernel's module."""
    key = getattr(fn, "cache_key", None)
    if isinstance(key, str):
        return key
    inner = getattr(fn, "fn", fn)
    return hashlib.sha256(inspect.getsource(inspect.getmodule(inner)).encode()).hexdigest()


def build_hash(key: Hashable, fn: Any, target: str) -> str:
    """What identifies one compiled variant: the frozen key (its repr names every field),
    the kernel source (and its helpers'), and the backend/target it was compiled for."""
    text = f"{type(key).__qualname__}|{key!r}|{source_hash(fn)}|{target}"
    return hashlib.sha256(text.encode()).hexdigest()


def target_of(device: Any) -> str:
    """ "backend:arch:warp" of a torch device, or "interpreter" on a CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return "interpreter"
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return f"hip:{props.gcnArchName.split(':')[0]}:64"
    return f"cuda:{props.major}{props.minor}:32"


class CompileCache:
    """Compiled variants by build hash; a variant is compiled once per process."""

    def __init__(self) -> None:
        self._by_hash: dict[str, Any] = {}

    def get(self, key: Hashable, fn: Any, target: str, compile: Callable[[], T]) -> T:
        h = build_hash(key, fn, target)
        if h not in self._by_hash:
            self._by_hash[h] = compile()
        return self._by_hash[h]

    def warm(
        self, keys: Iterable[Hashable], fn: Any, target: str, compile: Callable[[Hashable], T]
    ) -> dict[Hashable, T]:
        """Compile every key (e.g. every width) now: before memory profiling and capture."""
        return {k: self.get(k, fn, target, lambda k=k: compile(k)) for k in keys}

    def __len__(self) -> int:
        return len(self._by_hash)


@dataclass(frozen=True)
class Resources:
    """What one program of a compiled kernel holds on its SM."""

    registers: int  # per thread
    shared: int  # bytes
    threads: int
    spill_bytes: int = 0
    # ptxas serialized the kernel's wgmma (its C7515 advisory): each one waits for the last,
    # a loop of them runs at the tensor core's latency, not its rate
    wgmma_serialized: bool = False

    @classmethod
    def of_compiled(cls, kernel: Any) -> Resources:
        """From a Triton CompiledKernel loaded on a GPU (registers known after loading)."""
        kernel._init_handles()
        md = kernel.metadata
        return cls(kernel.n_regs, md.shared, md.num_warps * md.warp_size, kernel.n_spills)

    @classmethod
    def of_ptx(cls, ptx: str, arch: str, shared: int, threads: int) -> Resources:
        """From PTX with Triton's bundled ptxas (no GPU needed), e.g. arch "sm_90a"."""
        import triton

        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            out = subprocess.run(
                [
                    triton.knobs.nvidia.ptxas.path,
                    "-v",
                    "--gpu-name",
                    arch,
                    f.name,
                    "-o",
                    "/dev/null",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
        text = out.stdout + out.stderr
        regs = re.search(r"Used (\d+) registers", text)
        spill = re.search(r"(\d+) bytes spill stores", text)
        if regs is None:
            raise RuntimeError(f"ptxas -v printed no register count:\n{text}")
        return cls(
            int(regs.group(1)),
            shared,
            threads,
            int(spill.group(1)) if spill else 0,
            "(C7515)" in text,
        )


@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM limits of a device (an H200 by default: the numbers of sm_90)."""

    sms: int = 132
    registers: int = 65536
    shared: int = 233472
    threads: int = 2048
    programs: int = 32
    register_unit: int = 256  # registers are allocated per warp in units of this

    @classmethod
    def of(cls, device: Any) -> DeviceLimits:
        import torch

        p = torch.cuda.get_device_properties(device)
        base = cls()
        return cls(
            sms=p.multi_processor_count,
            registers=getattr(p, "regs_per_multiprocessor", base.registers),
            shared=getattr(p, "shared_memory_per_multiprocessor", base.shared),
            threads=getattr(p, "max_threads_per_multi_processor", base.threads),
        )


def programs_per_sm(res: Resources, limits: DeviceLimits) -> tuple[int, str]:
    """How many programs of `res` one SM holds, and the limit that binds."""
    warps = -(-res.threads // 32)
    per_warp = -(-max(res.registers, 1) * 32 // limits.register_unit) * limits.register_unit
    bounds = {
        "registers": limits.registers // (per_warp * warps),
        "shared memory": limits.shared // res.shared if res.shared else limits.programs,
        "threads": limits.threads // res.threads,
        "programs per SM": limits.programs,
    }
    binding = min(bounds, key=bounds.get)
    return bounds[binding], binding


def residency_problem(
    res: Resources, programs: int, limits: DeviceLimits, what: str = "kernel"
) -> str | None:
    """None if a grid of `programs` can be resident at once, else why not (clear reason)."""
    per_sm, binding = programs_per_sm(res, limits)
    if programs > per_sm * limits.sms:
        return (
            f"{what}: a grid of {programs} programs cannot be resident: {per_sm} per SM "
            f"({binding} binds: {res.registers} registers x {res.threads} threads, "
            f"{res.shared} B shared) x {limits.sms} SMs = {per_sm * limits.sms}"
        )
    return None
