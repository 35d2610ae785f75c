"""A kernel's launch arguments, declared once: name, type, doc and layout of each.

Why: the runner, every backend's build and the compile checks read one list, so a launch
that passes the wrong thing is refused naming the argument before a kernel reads it (a
wrong type fails inside the kernel, or specializes a second binary, or wedges the next
launch), and the docs of an argument live beside its type.

Types are Triton's words: "*bf16" a tensor of that element type ("*" any), "i32" / "i64"
an int (not a bool), "i1" a bool (or 0 / 1), "fp32" a float. A class stands for an object
of it: a bundle the build unpacks (a layer's weights).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8e4nv": torch.float8_e4m3fn,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i32": torch.int32,
    "i64": torch.int64,
}
INT_BITS = {"i32": 32, "i64": 64}
SCALARS = ("i1", "i32", "i64", "fp32")


@dataclass(frozen=True)
class Arg:
    name: str
    type: str | type  # see the module docstring
    doc: str
    layout: str = ""  # the named layout of the memory (e.g. "mxfp4-rot", "bf16 pairs")

    def __post_init__(self) -> None:
        t = self.type
        if isinstance(t, str) and t not in SCALARS and t != "*" and t[1:] not in DTYPES:
            raise ValueError(f"argument {self.name!r}: unknown type {t!r}")

    @cached_property
    def problem(self) -> Callable[[Any], str | None]:
        """Why a value cannot be this argument, or None (a function: a launch calls it)."""
        t = self.type
        if not isinstance(t, str):
            return lambda v: None if isinstance(v, t) else _expected(t.__name__, v)
        if t.startswith("*"):
            dtype = DTYPES.get(t[1:])

            def tensor(v: Any) -> str | None:
                if not isinstance(v, torch.Tensor):
                    return _expected(f"a tensor ({t})", v)
                if dtype is not None and v.dtype != dtype:
                    return f"expected {t}, got a {v.dtype} tensor"
                return None

            return tensor
        if t == "fp32":
            return lambda v: None if _number(v) else _expected("a float", v)
        if t == "i1":
            return lambda v: None if isinstance(v, int) and v in (0, 1) else _expected("a bool", v)
        low, high = -(1 << (INT_BITS[t] - 1)), 1 << (INT_BITS[t] - 1)

        def integer(v: Any) -> str | None:
            if isinstance(v, bool) or not isinstance(v, int):
                return _expected(f"an int ({t})", v)
            return None if low <= v < high else f"{v} does not fit {t}"

        return integer


def _number(v: Any) -> bool:
    return isinstance(v, (float, int)) and not isinstance(v, bool)


def _expected(what: str, value: Any) -> str:
    return f"expected {what}, got {type(value).__name__}"


@dataclass(frozen=True)
class KernelSpec:
    """The arguments of one kernel's launch, in launch order."""

    name: str
    args: tuple[Arg, ...]

    def __post_init__(self) -> None:
        names = self.names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{self.name}: argument(s) {twice} declared twice")

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @cached_property
    def by_name(self) -> dict[str, Arg]:
        return {a.name: a for a in self.args}

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise ValueError naming the first argument of `values` that is missing, unknown
        or of the wrong type (a few us: it runs at every launch)."""
        if len(values) != len(self.args) or any(n not in self.by_name for n in values):
            unknown = [n for n in values if n not in self.by_name]
            missing = [n for n in self.names if n not in values]
            what = f"unknown argument(s) {unknown}" if unknown else f"missing {missing}"
            raise ValueError(f"{self.name}: {what}")
        for a in self.args:
            problem = a.problem(values[a.name])
            if problem:
                raise ValueError(f"{self.name}: argument {a.name!r}: {problem}")


RUNTIME_ARGS: tuple[Arg, ...] = (
    Arg("ctl", "*i64", "the runner's control words (epoch, era base, deadline, fault injection)"),
    Arg("health", "i64", "the address of the health words (pinned host memory on a GPU)"),
    Arg("tickets", "*i64", "the ticket counter of each tag slot"),
    Arg("peers", "*i64", "every rank's peer-buffer base address, by rank"),
    Arg("rank", "i32", "this rank"),
    Arg("world", "i32", "ranks in the group"),
)
"""What every protocol kernel takes after its own arguments, in this order:
MonoRunner.runtime_args() (launch_args()'s ctl, health, tickets, then peer_args()'s
peers, rank, world)."""
