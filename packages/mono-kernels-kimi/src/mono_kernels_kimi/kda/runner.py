"""K1's host runner for one rank: builds per width and layer flags, argument checks before
every launch, `warm()` before graph capture, and the runtime's protocol state.

A LayerRunner (mono_runtime.kernel) on a `MonoRunner`: K1 takes its tickets, tags,
deadline, health words and alarm words from that runner like every other kernel, so a
wait that gives up while serving makes the runner's `after_step()` raise MonoFault (on
every rank: a final launch ends in the TP fault handshake) and its `guard()` poison the
step's hidden states. K1's scratch (spec's layout, then one done pair per item) is the
head of the runner's scratch buffer, so the runner's rezero erases its tags too; the
handshake uses the head of the runner's peer data (`runner_bytes` says how much).

Steps: with the engine's runner (`runner=`), `step_begin()` once per forward bumps its
epoch (graph-capturable) and each launch of the step takes the next tag slot; the last
launch of the step passes `final=True`. Without one, the KdaRunner owns a one-rank
runner and every launch is a step of its own (it bumps the epoch first): what a test or
benchmark that launches K1 alone wants.
"""

from __future__ import annotations

from typing import Any

import torch
from mono_runtime import protocol as P
from mono_runtime.errors import MonoFault
from mono_runtime.health import timeline
from mono_runtime.kernel import LayerRunner, same_device
from mono_runtime.runner import DEFAULT_DEADLINE_NS, MonoRunner
from mono_runtime.timeline import from_stamps, read_stamps

from ..config import KimiK3Config
from . import triton_build
from .checks import check_args
from .spec import ARGS, MAX_ROWS, K1Build, tunable_tiling


def default_tiling(cfg: KimiK3Config, device: torch.device) -> dict:
    """spec.tunable_tiling's tile sizes; programs = one per SM on a GPU."""
    programs = 3
    if device.type == "cuda":
        programs = torch.cuda.get_device_properties(device).multi_processor_count
    return dict(programs=programs, **tunable_tiling(cfg))


TILING_MIN = {
    "programs": 1,
    "block_h": 1,
    "block_n": 1,
    "block_k": 1,
    "split_k": 1,
    "stages": 1,
    "block_v": 1,
    "num_warps": 1,
}
"""Every tiling keyword and its least value (powers of two and tile limits: K1Build).
A wait's bound is the runner's deadline (`MonoRunner.set_deadline`), not a tiling."""


def _check_int(what: str, value, low: int) -> None:
    """Raise ValueError unless `value` is a plain int >= `low` (not a bool, float or tensor:
    a launch scalar that is not an int fails inside the kernel and wedges the next launch)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{what} must be >= {low}, got {value}")


def _check_shape(cfg: KimiK3Config, L: int, spec: bool, max_rows: int, tiling: dict) -> None:
    _check_int("L", L, 1)
    _check_int("max_rows", max_rows, 1)
    for name, value in tiling.items():
        if name not in TILING_MIN:
            known = ", ".join(TILING_MIN)
            raise ValueError(f"unknown tiling keyword {name!r} (known: {known})")
        _check_int(name, value, TILING_MIN[name])
    if not 1 <= L <= max_rows <= MAX_ROWS:
        raise ValueError(
            f"L = {L} and max_rows = {max_rows} must satisfy 1 <= L <= max_rows <= {MAX_ROWS}"
        )
    if not spec and L != 1:
        raise ValueError("a plain-decode runner has L = 1")


def _builds(cfg: KimiK3Config, L: int, spec: bool, widths, tiling: dict, timeline: bool):
    for r in widths:
        for delta in (False, True):
            for write in (False, True):
                yield K1Build.for_step(
                    cfg,
                    r,
                    L,
                    spec=spec,
                    delta=delta,
                    write_block=write,
                    timeline=timeline,
                    **tiling,
                )


def runner_bytes(
    cfg: KimiK3Config,
    device: torch.device | str,
    L: int,
    world: int,
    *,
    spec: bool = True,
    max_rows: int = MAX_ROWS,
    timeline: bool = False,
    **tiling,
) -> tuple[int, int]:
    """(scratch, peer) bytes the rank's MonoRunner needs for a KdaRunner of these
    arguments: every build's scratch (the largest) and the handshake's pairs."""
    _check_shape(cfg, L, spec, max_rows, tiling)
    tiling = {**default_tiling(cfg, torch.device(device)), **tiling}
    widths = range(1, max_rows // L + 1)
    builds = _builds(cfg, L, spec, widths, tiling, bool(timeline))
    scratch = max(triton_build.scratch_need(b) for b in builds)
    return scratch, triton_build.peer_bytes(world)


class KdaRunner(LayerRunner):
    """K1 launches for steps of `requests` x `L` rows (requests in `widths`).

    `runner`: the rank's MonoRunner (the engine's; every rank of its group builds a
    KdaRunner on it), sized by `runner_bytes`; None: a one-rank runner of its own with
    `deadline_ns`. `check_values`: slot and accepted-count values are checked before
    each launch (one device read: a sync); off for serving, on for tests. `timeline`:
    builds that stamp each item's program, start, ready and end (`timeline()`; GPU
    tuning)."""

    _closed_why = "its runner is closed"

    def __init__(
        self,
        cfg: KimiK3Config,
        device,
        L: int,
        *,
        spec: bool = True,
        max_rows: int = MAX_ROWS,
        runner: MonoRunner | None = None,
        deadline_ns: int = DEFAULT_DEADLINE_NS,
        check_values: bool = True,
        timeline: bool = False,
        **tiling,
    ) -> None:
        _check_shape(cfg, L, spec, max_rows, tiling)
        self.cfg, self.device, self.L, self.spec = cfg, torch.device(device), L, spec
        if self.device.type == "cuda" and self.device.index is None:
            # tensors report an indexed device; "cuda" alone would never compare equal
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.widths = tuple(range(1, max_rows // L + 1))
        self.tiling = {**default_tiling(cfg, self.device), **tiling}
        self._builds: dict[tuple, K1Build] = {}
        for b in _builds(cfg, L, spec, self.widths, self.tiling, bool(timeline)):
            self._builds[(b.requests, b.delta, b.write_block)] = b
        need = max(triton_build.scratch_need(b) for b in self._builds.values())
        self._owns_mono = runner is None
        if runner is None:
            peer = triton_build.peer_bytes(1)
            runner = MonoRunner(self.device, None, 0, 1, need, peer, deadline_ns)
        else:
            _check_runner(runner, self.device, need)
        self.mono = runner
        self.scratch = runner.scratch[:need]
        # each launch is a step of its own unless the engine's runner drives the steps
        self.auto_step = self._owns_mono
        self.check_values = check_values
        self._last: tuple[K1Build, bool] | None = None  # the last launch's build and `final`
        self._opened()

    def build(self, requests: int, delta: bool, write_block: bool) -> K1Build:
        key = (requests, delta, write_block)
        if key not in self._builds:
            raise ValueError(
                f"requests = {requests}: this runner serves {self.widths} "
                f"(rows = requests x {self.L} <= {MAX_ROWS})"
            )
        return self._builds[key]

    # -- protocol (LayerRunner's hooks) ----------------------------------------------------
    def _step_begin(self) -> None:
        """Bumps the runner's epoch (graph-capturable); launches take tag slots from 0."""
        self.mono.step_begin()

    def _after_step(self) -> None:
        self.mono.after_step()

    def _reset(self) -> None:
        """Collective on the runner's group: clears its scratch (K1's with it), tickets,
        peer buffer, health and tag era."""
        self.mono.reset()

    def _inject(self, rank: int | None, delay_ns: int) -> None:
        """The named rank stalls `delay_ns` (or until an alarm) before the TP fault
        handshake of each final launch: past the deadline, every rank raises."""
        self.mono.inject(rank, delay_ns)

    def _release(self) -> None:
        if self._owns_mono:
            self.mono.close()

    def guard(self, x: torch.Tensor) -> None:
        """The runner's device-side fault check: NaN into `x` once any alarm is set."""
        self._live()
        self.mono.guard(x)

    # -- launches -------------------------------------------------------------------------
    def __call__(self, requests: int, *, final: bool = False, **step) -> torch.Tensor:
        """One KDA layer on `step`, the keywords `check_args` takes (prefix, delta, blocks,
        num_blocks, write_idx, weights, conv_state, state, state_indices, num_accepted,
        out), so K1's argument list is written once; updates prefix, blocks, conv_state
        and state in place and writes `out` [rows, local_proj] (o_proj's input).
        `conv_state` is vLLM's conv cache as [slots, dim, state_len] (its SD layout
        transposed). `final`: the step's last K1 launch, which ends in the TP fault
        handshake (on the engine's runner: pass it on the last KDA layer)."""
        self._live()
        _check_int("requests", requests, 1)
        _check_int("K1 argument `num_blocks`", step.get("num_blocks"), 0)
        _check_int("K1 argument `write_idx`", step.get("write_idx"), -1)
        if not isinstance(final, bool):
            raise ValueError(f"final must be a bool, got {type(final).__name__} {final!r}")
        build = self.build(requests, step.get("delta") is not None, step["write_idx"] >= 0)
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        check_args(build, **step, scratch=self.scratch, values=self.check_values and not capturing)
        if self.auto_step:
            self._step_begin()
        cfg, w, delta = self.cfg, step["weights"], step["delta"]
        prefix, blocks, conv_state = step["prefix"], step["blocks"], step["conv_state"]
        state, state_indices = step["state"], step["state_indices"]
        num_accepted = step["num_accepted"]
        args = dict(
            prefix=prefix,
            delta=prefix if delta is None else delta,
            blocks=blocks,
            ares_norm=w["ares_norm"],
            ares_qk=w["ares_qk"],
            in_norm=w["in_norm"],
            in_proj=w["in_proj"],
            f_b=w["f_b"],
            conv_w=w["conv"],
            a_log=w["a_log"],
            dt_bias=w["dt_bias"],
            o_norm=w["o_norm"],
            conv_state=conv_state,
            state=state,
            state_indices=state_indices,
            num_accepted=state_indices if num_accepted is None else num_accepted,
            out=step["out"],
            scratch=self.scratch,
            blocks_row_stride=blocks.stride(0),
            blocks_block_stride=blocks.stride(1),
            conv_slot_stride=conv_state.stride(0),
            conv_dim_stride=conv_state.stride(1),
            conv_pos_stride=conv_state.stride(2),
            state_slot_stride=state.stride(0),
            indices_row_stride=state_indices.stride(0),
            num_blocks=step["num_blocks"],
            write_idx=max(step["write_idx"], 0),
            num_slots=state.shape[0],
            eps=cfg.rms_norm_eps,
            out_eps=cfg.rms_norm_eps,
            o_norm_eps=cfg.o_norm_eps,
            lower_bound=cfg.gate_lower_bound,
        )
        assert tuple(args) == ARGS
        args.update(slot=self.mono.take_slot(), final=final, **self.mono.runtime_args())
        triton_build.launch(build, args)
        self._last = (build, final)
        return step["out"]

    def layer_flags(self) -> tuple[tuple[bool, bool], ...]:
        """The (delta, write_block) pairs the model's KDA layers need: a delta after the
        first layer, a block write on AttnRes block boundaries."""
        cfg = self.cfg
        kda = [i for i in range(cfg.num_hidden_layers) if cfg.is_kda_layer(i)]
        return tuple(sorted({(i > 0, cfg.attn_res_blocks(i)[1] >= 0) for i in kda}))

    def warm(self, flags: tuple[tuple[bool, bool], ...] | None = None) -> list[K1Build]:
        """Compile and load every build the model needs (each width x `layer_flags()`, or
        the given (delta, write_block) pairs) by launching it on a padded step: every slot
        -1, so it writes no cache. The launches are one step of their own (it begins it);
        raises MonoFault if one gave up a wait. Call before memory profiling and graph
        capture."""
        self._live()
        cfg, dev = self.cfg, self.device
        P_, H = cfg.local_proj, cfg.hidden_size
        weights = {
            "ares_norm": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "ares_qk": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "in_norm": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "in_proj": torch.zeros(cfg.in_proj_rows, H, dtype=torch.bfloat16, device=dev),
            "f_b": torch.zeros(P_, cfg.f_a_dim, dtype=torch.bfloat16, device=dev),
            "conv": torch.zeros(3 * P_, 4, dtype=torch.float32, device=dev),
            "a_log": torch.zeros(cfg.local_heads, dtype=torch.float32, device=dev),
            "dt_bias": torch.zeros(P_, dtype=torch.float32, device=dev),
            "o_norm": torch.zeros(cfg.kda_head_dim, dtype=torch.bfloat16, device=dev),
        }
        conv_state = torch.zeros(1, 3 * P_, 3 + self.L - 1, dtype=torch.bfloat16, device=dev)
        state = torch.zeros(1, cfg.local_heads, cfg.kda_head_dim, cfg.kda_head_dim, device=dev)
        warmed = []
        self.step_begin()
        for r in self.widths:
            S = r * self.L
            shape = (r, self.L) if self.spec else (r,)
            idx = torch.full(shape, -1, dtype=torch.int32, device=dev)
            acc = torch.ones(r, dtype=torch.int32, device=dev) if self.spec else None
            for delta, write in flags or self.layer_flags():
                self(
                    r,
                    prefix=torch.zeros(S, H, dtype=torch.bfloat16, device=dev),
                    delta=torch.zeros(S, H, dtype=torch.bfloat16, device=dev) if delta else None,
                    blocks=torch.zeros(S, 2, H, dtype=torch.bfloat16, device=dev),
                    num_blocks=1 if write else 0,
                    write_idx=1 if write else -1,
                    weights=weights,
                    conv_state=conv_state,
                    state=state,
                    state_indices=idx,
                    num_accepted=acc,
                    out=torch.empty(S, P_, dtype=torch.bfloat16, device=dev),
                )
                warmed.append(self.build(r, delta, write))
        self.check()
        return warmed

    def timeline(self) -> list[dict]:
        """The runner's last launch, item by item in ticket order: mono_runtime.timeline's
        rows (stage: `K1Build.stage_of`; times in us of the device clock, of poll counts
        under the interpreter). Only the last: every width shares one scratch region."""
        self._live()
        if self._last is None or not self._last[0].timeline:
            raise ValueError(
                "timeline: no launch of a build that stamps items (KdaRunner(timeline=True))"
            )
        b, final = self._last
        off, n = b.scratch_layout()["timeline"]
        stamps = read_stamps(self.scratch[off : off + n], b.tickets(final))
        return from_stamps(stamps, b.stage_of)

    def check(self) -> None:
        """Wait for the device, then raise MonoFault if any launch on the runner since its
        last reset gave up a wait (the runner's health words, with their timeline). For
        tests, benchmarks and warm-up: serving reads the same words in `after_step()`,
        with no sync."""
        self._live()
        mono = self.mono
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if int(mono.health[P.H_GIVEUPS]):
            head, _, body = timeline(
                mono.rank, mono.health.tolist(), mono.alarms.tolist(), mono.unit
            ).partition("\n")
            raise MonoFault(f"K1: {head}; call reset() before the next launch", body)


def _check_runner(runner: Any, device: torch.device, need: int) -> None:
    if not isinstance(runner, MonoRunner):
        raise ValueError(f"runner: expected a MonoRunner, got {type(runner).__name__}")
    if runner.closed:
        raise ValueError("runner: it is closed")
    if not same_device(runner.device, device):
        raise ValueError(f"runner: on {runner.device}, this KdaRunner is on {device}")
    peer = P.PEER_HEAD + triton_build.peer_bytes(runner.world)
    if runner.scratch.numel() < need or runner.peer.bytes.numel() < peer:
        raise ValueError(
            f"runner: {runner.scratch.numel()} scratch and {runner.peer.bytes.numel()} peer "
            f"bytes, K1 needs {need} and {peer} (mono_kernels_kimi.kda.runner.runner_bytes)"
        )
