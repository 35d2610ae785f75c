"""Test helpers for FlyDSL builds: skip with a reason where the toolchain is absent, and
find the bounded-wait loops of a kernel's ISA for assertions on them."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from .isa import KernelIsa
from .toolchain import find_lld


def toolchain_missing() -> str | None:
    """Why FlyDSL cannot compile for gfx9 here, or None when it can."""
    if importlib.util.find_spec("flydsl") is None:
        return "FlyDSL is not installed (it is in the workspace's dev group, linux x86_64 only)"
    if find_lld() is None:
        return "no ld.lld to link gfx9 code objects (apt-get install lld-19, or set ROCM_PATH)"
    return None


def require_toolchain() -> None:
    import pytest

    reason = toolchain_missing()
    if reason:
        pytest.skip(reason)


@dataclass(frozen=True)
class WaitLoop:
    """One sleeping poll loop of a kernel: its body and the lines after it up to the next
    label or branch target (where the acquire of the wait must be)."""

    label: str
    body: tuple[str, ...]
    after: tuple[str, ...]

    def loads(self) -> list[str]:
        return [ln for ln in self.body if re.match(r"(global|buffer|flat)_load", ln)]


def wait_loops(isa: KernelIsa) -> list[WaitLoop]:
    """Every innermost loop whose body sleeps (``s_sleep``): the label it branches back to,
    its lines, and the 40 lines after its back branch (a ticket loop around a wait sleeps
    too, but only through the wait inside it)."""
    body = list(isa.body)
    loops = []
    for i, line in enumerate(body):
        m = re.match(r"s_(?:c)?branch\w*\s+(\.LBB\w+)", line)
        if not m:
            continue
        try:
            start = body.index(f"{m.group(1)}:")
        except ValueError:
            continue
        if start < i and any(ln.startswith("s_sleep") for ln in body[start:i]):
            after = tuple(body[i + 1 : i + 41])
            loops.append(WaitLoop(m.group(1), tuple(body[start + 1 : i]), after))
    inner = [
        loop
        for loop in loops
        if not any(f"{other.label}:" in loop.body for other in loops if other is not loop)
    ]
    # a loop can have several back branches (a latch block and a continue): keep the longest
    by_label: dict[str, WaitLoop] = {}
    for loop in inner:
        if len(loop.body) > len(by_label.get(loop.label, WaitLoop("", (), ())).body):
            by_label[loop.label] = loop
    return list(by_label.values())


SYS, DEV = "sc0 sc1", "sc1"  # gfx9 cache bits of system- and device-scope accesses


def scope(line: str) -> str | None:
    """The scope an instruction's cache bits give: SYS, DEV or None."""
    return SYS if line.endswith(SYS) else DEV if line.endswith(" " + DEV) else None


def release_before(body, k: int) -> str | None:
    """The scope of the release (``buffer_wbl2``) the access at line k is behind: walking
    back over the text (branches may merge the stores of several paths into one block), the
    first write-back met before any other store or atomic."""
    for ln in reversed(body[:k]):
        if ln.startswith("buffer_wbl2"):
            return scope(ln)
        if re.match(r"^(global|buffer|flat)_(store|atomic)", ln):
            return None
    return None


def giveup_claims(isa: KernelIsa) -> list[int]:
    """Lines of the health-record claims of give-up paths: the device-scope atomic add on
    ctl[CTL_GIVEUPS] (its immediate offset names the word)."""
    from ..protocol import CTL_GIVEUPS

    rx = re.compile(rf"^global_atomic_add_x2 .* offset:{8 * CTL_GIVEUPS} sc0$")
    return [i for i, ln in enumerate(isa.body) if rx.match(ln)]


def system_stores(isa: KernelIsa) -> tuple[list[int], list[int]]:
    """Lines of 64-bit system-scope stores: (behind a system release, the others)."""
    body = isa.body
    stores = [
        k for k, ln in enumerate(body) if ln.startswith("global_store_dwordx2") and scope(ln) == SYS
    ]
    behind = [k for k in stores if release_before(body, k) == SYS]
    return behind, [k for k in stores if k not in behind]
