"""DrafterRunner: one rank's DSpark draft layers and final norm as persistent kernels.

A LayerRunner (mono_runtime.kernel) on its own MonoRunner, built collectively outside graph
capture (the peer exchange is collective), like K2Runner. The weights and the draft KV
caches are bound at construction into a device table of addresses (one row a layer), so a
launch passes no per-layer tensors; an engine that re-binds its draft KV caches makes the
runner `stale()`, and a new runner is needed. A step's requests split into independent
launches of at most 8 (each request reads only its own rows and cache): the narrow build
serves 1-2 requests, the wide one 3-8. Each launch takes `layers` consecutive tag slots
from the MonoRunner (spec: layer k's pushes carry slot + k's tag). `after_step()` raises
MonoFault on every rank after any give-up; `reset()` makes the runner usable again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from mono_runtime import protocol as P
from mono_runtime.errors import MonoUnsupported
from mono_runtime.kernel import same_device, target_name
from mono_runtime.kernel.mono_layer_runner import MonoHooks
from mono_runtime.planner import agree
from mono_runtime.runner import DEFAULT_DEADLINE_NS, MonoRunner
from mono_runtime.timeline import from_stamps, read_stamps

from .build import DrafterTriton
from .config import DrafterConfig
from .spec import (
    LAYER_POINTERS,
    MAX_REQUESTS,
    NARROW,
    DrafterBuild,
    build_problem,
    peer_bytes,
    scratch_bytes,
    scratch_layout,
    stage_of,
    tickets,
)
from .weights import DrafterWeights

BF16, F32 = torch.bfloat16, torch.float32


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def cache_view(cache: Any) -> Any:
    """The engine's draft cache `[blocks, 1, block, entry]` as the kernel reads it
    (`[blocks, block, entry]`); anything else unchanged."""
    if isinstance(cache, torch.Tensor) and cache.dim() == 4 and cache.shape[1] == 1:
        return cache.squeeze(1)
    return cache


def programs_per_cu(cfg: DrafterConfig) -> int:
    """Programs a CU the builds of `cfg` are planned for (both builds plan alike)."""
    return DrafterBuild(cfg, False).plan.occ


def refusals(
    cfg: DrafterConfig,
    world: int,
    caches: Sequence[Any],
    rope: Any,
    cus: int | None,
    programs: int,
) -> list[str]:
    """Why the drafter kernels cannot serve this deployment (empty: they can): the TP size,
    layer count and shapes the builds take, the RoPE cos/sin cache, the draft KV caches,
    and the device's CU count (`cus`, None on a CPU) against the grid of `programs`."""
    out = []
    problem = build_problem(cfg)
    if problem:
        out.append(problem)
    if world != cfg.tp:
        out.append(f"TP size {world}: the draft config is for tp {cfg.tp}")
    occ = 1 if problem else programs_per_cu(cfg)
    if cus is not None and programs > occ * cus:
        out.append(f"CU count {cus}: a grid of {programs} programs, more than {occ} a CU")
    r = cfg.qk_rope_head_dim
    if not isinstance(rope, torch.Tensor):
        out.append(f"rope cache: expected a tensor, got {type(rope).__name__}")
    elif rope.dtype != F32:
        out.append(f"rope cache dtype {rope.dtype}: the kernel reads the fp32 cos/sin table")
    elif rope.dim() != 2 or rope.shape[1] != r:
        out.append(f"rope cache shape {tuple(rope.shape)}: expected [positions, {r}] (cos | sin)")
    elif rope.shape[0] < cfg.max_position_embeddings:
        out.append(
            f"rope cache: {rope.shape[0]} positions, fewer than max_position_embeddings "
            f"{cfg.max_position_embeddings}"
        )
    elif not rope.is_contiguous():
        out.append("rope cache: must be contiguous")
    if len(caches) != cfg.num_hidden_layers:
        out.append(f"layer count: {len(caches)} draft KV caches for {cfg.num_hidden_layers} layers")
    want = torch.uint8 if cfg.fp8_cache else BF16
    blocks = None
    for i, cache in enumerate(caches):
        c = cache_view(cache)
        if not isinstance(c, torch.Tensor):
            out.append(f"KV cache {i}: expected a tensor, got {type(c).__name__}")
            continue
        if c.dim() != 3 or tuple(c.shape[1:]) != (cfg.block_size, cfg.kv_entry):
            out.append(
                f"KV cache {i} shape {tuple(cache.shape)}: expected [blocks, (1,) "
                f"{cfg.block_size}, {cfg.kv_entry}]"
            )
        elif c.dtype != want:
            out.append(f"KV cache {i} dtype {c.dtype}: cache_dtype {cfg.cache_dtype!r} is {want}")
        elif not c.is_contiguous():
            out.append(f"KV cache {i}: must be contiguous (strides {tuple(c.stride())})")
        elif c.data_ptr() % 16:
            out.append(f"KV cache {i}: address {c.data_ptr():#x} is not 16-byte aligned")
        elif blocks is not None and c.shape[0] != blocks:
            out.append(f"KV cache {i}: {c.shape[0]} blocks, layer 0 has {blocks}")
        blocks = c.shape[0] if blocks is None else blocks
    return out


def _signature(caches: Sequence[torch.Tensor]) -> list[tuple]:
    """What binds a cache: its address, dtype and per-block layout (not the block count:
    an extensible cache re-binds its views at the same address with a final count)."""
    out = []
    for c in caches:
        v = cache_view(c)
        if not isinstance(v, torch.Tensor):
            out.append(None)
            continue
        out.append((v.data_ptr(), v.dtype, tuple(v.shape[1:]), tuple(v.stride()), v.device))
    return out


class DrafterRunner(MonoHooks):
    def __init__(
        self,
        cfg: DrafterConfig,
        group: Any,
        rank: int,
        device: torch.device | str,
        weights: DrafterWeights,
        caches: Sequence[torch.Tensor],
        rope: torch.Tensor,
        deadline_ns: int = DEFAULT_DEADLINE_NS,
        programs: int | None = None,
        timeline: bool = False,
    ) -> None:
        """Collective (every rank of `group`, `cfg.tp` of them, same config): `weights` this
        rank's, `caches` the draft layers' KV caches (`[blocks, (1,) block, entry]`),
        `rope` the draft's fp32 cos/sin table; `timeline`: builds that stamp each item's
        program, start and end (`timeline(wide)`). Raises MonoUnsupported on every rank when
        any rank cannot be served (weights of another shape included), ValueError for an
        argument of the wrong kind, both before allocating."""
        self.cfg, self.rank, self.tp = cfg, rank, cfg.tp
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if programs is not None and (
            isinstance(programs, bool) or not isinstance(programs, int) or programs < 1
        ):
            raise ValueError(f"programs: expected an int >= 1, got {programs!r}")
        if not isinstance(weights, DrafterWeights):
            raise ValueError(f"weights: expected DrafterWeights, got {type(weights).__name__}")
        if not isinstance(caches, Sequence):
            raise ValueError(f"caches: expected a list of tensors, got {type(caches).__name__}")
        if self.device.type == "cpu" and not P.cpu_interpreter():
            raise MonoUnsupported("a CPU device needs TRITON_INTERPRET=1 (the Triton interpreter)")
        world = 1 if group is None else group.size()
        cus = None
        if self.device.type == "cuda":
            cus = torch.cuda.get_device_properties(self.device).multi_processor_count
        if programs is None:
            programs = programs_per_cu(cfg) * cus if cus is not None else 2
        reasons = refusals(cfg, world, caches, rope, cus, programs)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            reasons.append("built during graph capture (the peer exchange is collective)")
        if not reasons:  # what one rank alone could lack is agreed too: no rank raises alone
            try:
                weights.validate(cfg, self.device)
            except ValueError as err:
                reasons.append(str(err))
            tensors = [("rope", rope)] + [(f"caches[{i}]", c) for i, c in enumerate(caches)]
            reasons += [
                f"{name}: on {t.device}, expected {self.device}"
                for name, t in tensors
                if not same_device(t.device, self.device)
            ]
        agree(reasons, group, "this draft deployment")
        self.programs = programs
        self.builds = {wide: DrafterBuild(cfg, wide, bool(timeline)) for wide in (False, True)}
        self.kernels = {wide: DrafterTriton(b) for wide, b in self.builds.items()}
        target = target_name(self.device)
        for kernel in self.kernels.values():
            reason = kernel.supports(target)
            if reason:
                raise MonoUnsupported(f"drafter runner on {target}: {reason}")
        self.offsets, off = {}, 0
        for wide, b in self.builds.items():
            self.offsets[wide] = off
            off += scratch_bytes(b)
        self.mono = MonoRunner(self.device, group, rank, self.tp, off, peer_bytes(cfg), deadline_ns)
        self.caches = [cache_view(c) for c in caches]
        self._bound = _signature(caches)
        self.weights, self.rope = weights, rope
        rows = []
        for layer, cache in zip(weights.layers, self.caches, strict=True):
            named = layer.tensors() | {"cache": cache}
            rows.append([named[name].data_ptr() for name in LAYER_POINTERS])
        self.table = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self._opened()

    def stale(self, caches: Sequence[torch.Tensor]) -> bool:
        """True when the engine's draft KV caches `caches` are not the ones this runner
        bound (re-allocated, another dtype or block layout): a new runner is needed."""
        self._live()
        return len(caches) != len(self._bound) or _signature(caches) != self._bound

    # -- views ----------------------------------------------------------------------------
    def region(self, wide: bool, name: str) -> torch.Tensor:
        """uint8 view of region `name` of the narrow or wide build's scratch."""
        self._live()
        off, n = scratch_layout(self.builds[wide])[name]
        base = self.offsets[wide] + off
        return self.mono.scratch[base : base + n]

    def timeline(self, wide: bool) -> list[dict]:
        """The narrow or wide build's last launch, item by item in ticket order:
        mono_runtime.timeline's rows (stage: the spec's stage name, "final" for the final
        norm; times in us of the device clock, of poll counts under the interpreter)."""
        self._live()
        b = self.builds[wide]
        if not b.timeline:
            raise ValueError("timeline: this runner's builds do not stamp items (timeline=True)")
        stamps = read_stamps(self.region(wide, "timeline"), tickets(b))
        return from_stamps(stamps, lambda t: stage_of(b, t)[1])

    # -- launches -------------------------------------------------------------------------
    def warm(self) -> None:
        """Compile both builds before memory profiling and graph capture; refuse a build
        whose grid cannot be resident (GPU only: the interpreter compiles nothing)."""
        self._live()
        q, h, dev = self.cfg.query_len, self.cfg.hidden_size, self.device
        for wide, kernel in self.kernels.items():
            n = self.builds[wide].requests
            t = n * q
            args = self._args(
                wide,
                torch.zeros(t, h, dtype=BF16, device=dev),
                torch.zeros(t, dtype=torch.int64, device=dev),
                torch.full((t,), -1, dtype=torch.int64, device=dev),
                torch.zeros(n, 1, dtype=torch.int32, device=dev),
                torch.zeros(n, dtype=torch.int32, device=dev),
                torch.zeros(t, h, dtype=BF16, device=dev),
                n,
                0,
            )
            kernel.warm(self.programs, **args)

    def _args(self, wide, embeds, positions, slots, block_table, seq_lens, out, n, slot):
        b = self.builds[wide]
        off = self.offsets[wide]
        return dict(
            embeds=embeds,
            positions=positions,
            slot_mapping=slots,
            block_table=block_table,
            seq_lens=seq_lens,
            out=out,
            table=self.table,
            final_norm=self.weights.final_norm,
            rope=self.rope,
            scratch=self.mono.scratch[off : off + scratch_bytes(b)],
            nreq=n,
            slot=slot,
            **self.mono.runtime_args(),
        )

    def __call__(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One draft step of R requests (rows request-major, `query_len` each): returns the
        final-normed hidden states [R x query_len, H] (0 on padding requests, seq_len 0)
        and writes every layer's block entries at `slot_mapping` (none for a negative
        slot). Launches of <= 8 requests; bad input raises ValueError before any launch."""
        self._live()
        reqs = self._check(embeds, positions, slot_mapping, block_table, seq_lens, out)
        if out is None:
            out = torch.empty_like(embeds)
        q, nl = self.cfg.query_len, self.cfg.num_hidden_layers
        chunks = [(r, min(r + MAX_REQUESTS, reqs)) for r in range(0, reqs, MAX_REQUESTS)]
        slots = []
        for _ in chunks:  # every slot is taken before the first launch: a refusal launches nothing
            first = self.mono.take_slot()
            for _ in range(nl - 1):
                self.mono.take_slot()
            slots.append(first)
        for (r0, r1), slot in zip(chunks, slots, strict=True):
            rows = slice(r0 * q, r1 * q)
            wide = r1 - r0 > NARROW
            args = self._args(
                wide,
                embeds[rows],
                positions[rows],
                slot_mapping[rows],
                block_table[r0:r1],
                seq_lens[r0:r1],
                out[rows],
                r1 - r0,
                slot,
            )
            self.kernels[wide].launch(self.programs, **args)
        return out

    def _check(self, embeds, positions, slot_mapping, block_table, seq_lens, out) -> int:
        c = self.cfg
        q, h = c.query_len, c.hidden_size
        if not isinstance(embeds, torch.Tensor) or embeds.dim() != 2:
            raise ValueError(f"embeds: expected a 2-D tensor [requests x {q}, {h}]")
        t = embeds.shape[0]
        if t == 0 or t % q:
            raise ValueError(f"embeds: {t} rows, expected a positive multiple of query_len {q}")
        reqs = t // q
        nl = c.num_hidden_layers
        need = -(-reqs // MAX_REQUESTS) * nl
        if need > P.SLOTS:
            raise ValueError(f"embeds: {reqs} requests need {need} tag slots (> {P.SLOTS})")
        for name, x, shape, dtype in (
            ("embeds", embeds, (t, h), BF16),
            ("positions", positions, (t,), torch.int64),
            ("slot_mapping", slot_mapping, (t,), torch.int64),
            ("seq_lens", seq_lens, (reqs,), torch.int32),
            ("out", out, (t, h), BF16),
        ):
            if x is None:
                continue
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(x).__name__}")
            if tuple(x.shape) != shape:
                raise ValueError(f"{name}: shape {tuple(x.shape)}, expected {shape}")
            if x.dtype != dtype:
                raise ValueError(f"{name}: dtype {x.dtype}, expected {dtype}")
            if not x.is_contiguous():
                raise ValueError(f"{name}: must be contiguous (strides {x.stride()})")
            if not same_device(x.device, self.device):
                raise ValueError(f"{name}: on {x.device}, expected {self.device}")
        bt = block_table
        if not isinstance(bt, torch.Tensor) or bt.dim() != 2 or bt.shape[0] != reqs:
            raise ValueError(f"block_table: expected a 2-D tensor [{reqs}, pages]")
        if bt.dtype != torch.int32:
            raise ValueError(f"block_table: dtype {bt.dtype}, expected {torch.int32}")
        if bt.stride(1) != 1 or bt.shape[1] < 1:
            raise ValueError(f"block_table: rows must be contiguous (strides {bt.stride()})")
        if not same_device(bt.device, self.device):
            raise ValueError(f"block_table: on {bt.device}, expected {self.device}")
        if out is not None:
            a, b = _span(out)
            lo, hi = _span(embeds)
            if a < hi and lo < b:
                raise ValueError("out: shares memory with embeds")
        return reqs
