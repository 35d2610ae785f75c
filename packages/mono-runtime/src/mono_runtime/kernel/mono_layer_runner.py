"""MonoLayerRunner: a LayerRunner whose kernel launches on a MonoRunner, one build and one
scratch region per width (token rows a launch serves).

Why a base: every such runner validates its widths, devices and grid alike, places its
widths' scratch regions one after another in a MonoRunner it owns or shares (then the
owner closes it), and forwards the LayerRunner hooks to it: the FFN's and K2's runners
would otherwise each hold a copy. A subclass builds its kernels between `_setup` and
`_attach` and names its scratch layout (`_layout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import protocol as P
from ..errors import MonoUnsupported
from ..runner import MonoRunner
from .layer_runner import LayerRunner


class MonoHooks(LayerRunner):
    """A LayerRunner whose kernels launch on `self.mono`: its hooks forward to that
    MonoRunner (a launch's runtime arguments are `self.mono.runtime_args()`), one copy for
    every such runner (those with one build per width below, and the drafter's pair).
    It closes `mono` when it owns it (`_owns_mono`)."""

    mono: MonoRunner
    _owns_mono = True

    # -- protocol (LayerRunner's hooks) ----------------------------------------------------
    def _step_begin(self) -> None:
        """Bumps the (shared) runner's epoch; launches take tag slots from 0 again."""
        self.mono.step_begin()

    def _after_step(self) -> None:
        self.mono.after_step()

    def _reset(self) -> None:
        """Collective: clears the scratch, peer buffer, health and the tag era."""
        self.mono.reset()

    def _inject(self, rank: int | None, delay_ns: int) -> None:
        self.mono.inject(rank, delay_ns)

    def _release(self) -> None:
        if self._owns_mono:
            self.mono.close()


class MonoLayerRunner(MonoHooks):
    """Sets `device` (indexed), `widths` (sorted), `cpu`, `offsets` (width -> scratch
    offset) and `mono` (the MonoRunner)."""

    _owns_mono = False

    def _setup(
        self, device: Any, widths: Iterable[int], programs: int | None, scratch_offset: int = 0
    ) -> None:
        """Validate the device, widths, grid and where the scratch regions start (in a
        shared runner: past what its other kernels use) before anything is allocated."""
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # tensors report an indexed device; "cuda" alone would never compare equal
            self.device = torch.device("cuda", torch.cuda.current_device())
        widths = list(widths)
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
            raise ValueError(f"widths: expected a non-empty list of ints, got {widths!r}")
        self.widths = tuple(sorted(set(widths)))
        if programs is not None and (
            isinstance(programs, bool) or not isinstance(programs, int) or programs < 1
        ):
            raise ValueError(f"programs: expected an int >= 1, got {programs!r}")
        if isinstance(scratch_offset, bool) or not isinstance(scratch_offset, int):
            raise ValueError(f"scratch_offset: expected an int, got {scratch_offset!r}")
        if scratch_offset < 0 or scratch_offset % 256:
            raise ValueError(f"scratch_offset: {scratch_offset} is not a multiple of 256 >= 0")
        if self.device.type == "cpu" and not P.cpu_interpreter():  # before any allocation
            raise MonoUnsupported("a CPU device needs TRITON_INTERPRET=1 (the Triton interpreter)")
        self.cpu = self.device.type == "cpu"

    def _attach(
        self,
        scratch: Mapping[int, int],
        need_peer: int,
        group: Any,
        rank: int,
        tp: int,
        deadline_ns: int,
        runner: MonoRunner | None,
        scratch_offset: int = 0,
    ) -> None:
        """Place each width's `scratch[s]` bytes from `scratch_offset` on, in width order,
        in `runner` (checked to be large enough) or in a MonoRunner made here (collective:
        every rank of `group` the same arguments)."""
        self.offsets, self._scratch_bytes, off = {}, dict(scratch), scratch_offset
        for s in self.widths:
            self.offsets[s] = off
            off += scratch[s]
        self._owns_mono = runner is None
        if runner is None:
            runner = MonoRunner(self.device, group, rank, tp, off, need_peer, deadline_ns)
        elif runner.scratch.numel() < off or runner.peer.bytes.numel() < P.PEER_HEAD + need_peer:
            raise ValueError("runner: its scratch or peer buffer is smaller than this runner needs")
        self.mono = runner

    def _layout(self, s: int) -> Mapping[str, tuple[int, int]]:
        """Width s's scratch regions: name -> (offset, bytes) (the kernel's spec)."""
        raise NotImplementedError

    # -- views ----------------------------------------------------------------------------
    def scratch(self, s: int) -> torch.Tensor:
        """uint8 view of width s's whole scratch region (a launch's `scratch`)."""
        return self.mono.scratch[self.offsets[s] : self.offsets[s] + self._scratch_bytes[s]]

    def region(self, s: int, name: str) -> torch.Tensor:
        """uint8 view of region `name` of width s's scratch (`_layout`)."""
        self._live()
        off, n = self._layout(s)[name]
        base = self.offsets[s] + off
        return self.mono.scratch[base : base + n]

    def _routing(
        self, s: int, k: int, table: Mapping[str, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids int32 [s, k], topk_weights fp32 [s, k]) at `table`'s "topk_ids" and
        "topk_w" offsets in width s's "table" region."""
        t = self.region(s, "table")
        ids = t[table["topk_ids"] : table["topk_ids"] + 4 * s * k].view(torch.int32).view(s, k)
        w = t[table["topk_w"] : table["topk_w"] + 4 * s * k].view(torch.float32).view(s, k)
        return ids, w
