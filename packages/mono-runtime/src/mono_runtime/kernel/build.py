"""The Build interface: one variant of a kernel (a frozen key) on one backend.

Why one interface: the runner launches, `mono qualify` compiles and `mono bench` lists
every build the same way, with no per-kernel scripts or attribute probes; and a build says
itself what it refuses (`supports`, `compiler_missing`), so a check that cannot run on a
machine reports that reason (a SKIP) instead of passing.

Targets are names: "sm90" (a CUDA capability), "gfx950" (an AMD arch), and "interpreter"
(the Triton CPU interpreter).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..builds import target_of
from ..errors import MonoUnsupported
from .spec import KernelSpec

INTERPRETER = "interpreter"


def target_name(device: Any) -> str:
    """The target of a torch device: "sm90" for CUDA capability 9.0, the arch of a ROCm
    GPU ("gfx950"), "interpreter" for a CPU."""
    backend, _, rest = target_of(device).partition(":")
    if backend == INTERPRETER:
        return INTERPRETER
    arch = rest.split(":")[0]
    return f"sm{arch}" if backend == "cuda" else arch


@dataclass(frozen=True)
class Compiled:
    """What an ahead-of-time compile produced, in the terms every backend shares."""

    target: str
    shared: int  # bytes of shared memory (LDS) one program holds
    spills: int | None = None  # bytes (Triton: known once loaded) or registers spilled
    problem: str | None = None  # why the binary cannot run as launched (residency), or None
    binary: Any = field(default=None, compare=False, repr=False)  # the backend's own object


class Build(abc.ABC):
    """One compiled variant: `key` (the kernel's frozen build key) on `backend`.

    Subclasses name their `family` (the kernel: "ffn", "kda"), `backend` ("triton",
    "flydsl") and `targets` (what `compile_for` compiles for ahead of time; the compile
    checks cover each), and implement the rest."""

    family: ClassVar[str]
    backend: ClassVar[str]
    targets: ClassVar[tuple[str, ...]]

    def __init__(self, key: Hashable) -> None:
        self.key = key

    @classmethod
    def name(cls) -> str:
        """The registry's name of this build: "family backend"."""
        return f"{cls.family} {cls.backend}"

    @classmethod
    @abc.abstractmethod
    def example(cls) -> Build:
        """The build a compile check compiles: the real model's, at a width and TP it
        serves (a compile without a GPU needs no weights)."""

    @property
    @abc.abstractmethod
    def spec(self) -> KernelSpec:
        """The arguments `launch` and `warm` take."""

    @abc.abstractmethod
    def supports(self, target: str) -> str | None:
        """None when this build serves `target` (compiles for it and runs there), else
        why not, in a sentence a user can act on."""

    def compiler_missing(self) -> str | None:
        """Why `compile_for` cannot run on this machine (a compiler or linker absent), or
        None."""
        return None

    def compile_for(self, target: str) -> Compiled:
        """Compile ahead of time, without a GPU, exactly what a launch on `target` runs
        (the launch's specialization). Raises MonoUnsupported for a target this build does
        not serve or compile for, or that this machine cannot compile. Run it in a child
        process: a backend abort would take the caller down."""
        reason = self.supports(target) or self.compiler_missing()
        if reason is None and target not in self.targets:
            reason = f"it compiles ahead of time for {', '.join(self.targets)} only"
        if reason:
            raise MonoUnsupported(f"{self.name()} {target}: {reason}")
        return self._compile(target)

    @abc.abstractmethod
    def _compile(self, target: str) -> Compiled:
        """compile_for's work, for a target it accepted."""

    @abc.abstractmethod
    def warm(self, programs: int, **args: Any) -> None:
        """Compile and load for the device of `args` (a launch's arguments, `spec`'s; any
        values of the right types), before memory profiling and graph capture; raise
        MonoUnsupported when a grid of `programs` cannot run there. Launches nothing."""

    @classmethod
    def warm_all(cls, launches: Sequence[tuple[Build, Mapping[str, Any]]], programs: int) -> None:
        """`warm` each (build, args); a backend whose compiles share a process overrides it."""
        for build, args in launches:
            build.warm(programs, **args)

    @abc.abstractmethod
    def launch(self, programs: int, **args: Any) -> None:
        """Launch a grid of `programs` on `args` (`spec`'s, checked), on the current stream."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.key == self.key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r})"
