"""K1's host runner for one rank: builds per width and layer flags, one scratch region,
argument checks before every launch, `warm()` before graph capture, the error word.

K1 needs no collective, so the runner needs no peer memory. Its scratch region holds
the launch's control words, which the kernel leaves zeroed; launches on one stream
share it (one launch at a time). The scratch can be handed in (e.g. a slice of a
`mono_runtime` runner's scratch buffer) or is allocated here.
"""

from __future__ import annotations

import torch

from ..config import KimiK3Config
from . import triton_build
from .checks import check_args
from .spec import ARGS, ERROR, MAX_ROWS, K1Build


def default_tiling(cfg: KimiK3Config, device: torch.device) -> dict:
    """Tile sizes that fit the model's sizes; programs = one per SM on a GPU."""

    def pow2_at_most(n, cap):
        p = 1
        while p * 2 <= min(n, cap):
            p *= 2
        return p

    programs = 3
    block_n = 32 if cfg.in_proj_rows >= 4096 else 16
    prefetch = 4  # the interpreter never prefetches (x is ready before any in_proj item)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        programs = props.multi_processor_count
        l2 = getattr(props, "L2_cache_size", 0) or 50 << 20
        prefetch = (l2 * 5 // 8) // (block_n * cfg.hidden_size * 2)
    return dict(
        programs=programs,
        prefetch_items=prefetch,
        block_h=pow2_at_most(cfg.hidden_size, 512),
        block_n=block_n,
        block_k=pow2_at_most(cfg.hidden_size, 256),
        block_v=min(16, cfg.kda_head_dim // 2),
        max_polls=(1 << 22) if device.type == "cuda" else 1000,
    )


TILING_MIN = {
    "programs": 1,
    "prefetch_items": 0,
    "block_h": 1,
    "block_n": 1,
    "block_k": 1,
    "block_v": 1,
    "num_warps": 1,
    "max_polls": 1,
}
"""Every tiling keyword and its least value (powers of two and tile limits: K1Build)."""


def _check_int(what: str, value, low: int) -> None:
    """Raise ValueError unless `value` is a plain int >= `low` (not a bool, float or tensor:
    a launch scalar that is not an int fails inside the kernel and wedges the next launch)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{what} must be >= {low}, got {value}")


class KdaRunner:
    """K1 launches for steps of `requests` x `L` rows (requests in `widths`)."""

    def __init__(
        self,
        cfg: KimiK3Config,
        device,
        L: int,
        *,
        spec: bool = True,
        max_rows: int = MAX_ROWS,
        scratch: torch.Tensor | None = None,
        check_values: bool = True,
        **tiling,
    ) -> None:
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
        self.cfg, self.device, self.L, self.spec = cfg, torch.device(device), L, spec
        self.widths = tuple(range(1, max_rows // L + 1))
        self.tiling = {**default_tiling(cfg, self.device), **tiling}
        self._builds: dict[tuple, K1Build] = {}
        need = max(
            self.build(r, d, w).scratch_bytes
            for r in self.widths
            for d in (False, True)
            for w in (False, True)
        )
        if scratch is None:
            scratch = torch.zeros(need, dtype=torch.uint8, device=self.device)
        elif scratch.numel() < need or scratch.dtype != torch.uint8:
            raise ValueError(
                f"scratch: {scratch.numel()} bytes of {scratch.dtype}, need {need} uint8"
            )
        self.scratch = scratch
        # Slot and accepted-count values cost a device read (one sync) a launch; the kernel
        # treats an out-of-range slot as padding either way. Off for serving, on for tests.
        self.check_values = check_values

    def build(self, requests: int, delta: bool, write_block: bool) -> K1Build:
        key = (requests, delta, write_block)
        if key not in self._builds:
            if requests not in self.widths:
                raise ValueError(
                    f"requests = {requests}: this runner serves {self.widths} "
                    f"(rows = requests x {self.L} <= {MAX_ROWS})"
                )
            self._builds[key] = K1Build.for_step(
                self.cfg,
                requests,
                self.L,
                spec=self.spec,
                delta=delta,
                write_block=write_block,
                **self.tiling,
            )
        return self._builds[key]

    def __call__(self, requests: int, **step) -> torch.Tensor:
        """One KDA layer on `step`, the keywords `check_args` takes (prefix, delta, blocks,
        num_blocks, write_idx, weights, conv_state, state, state_indices, num_accepted,
        out), so K1's argument list is written once; updates prefix, blocks, conv_state
        and state in place and writes `out` [rows, local_proj] (o_proj's input).
        `conv_state` is vLLM's conv cache as [slots, dim, state_len] (its SD layout
        transposed)."""
        _check_int("requests", requests, 1)
        _check_int("K1 argument `num_blocks`", step.get("num_blocks"), 0)
        _check_int("K1 argument `write_idx`", step.get("write_idx"), -1)
        build = self.build(requests, step.get("delta") is not None, step["write_idx"] >= 0)
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        check_args(build, **step, scratch=self.scratch, values=self.check_values and not capturing)
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
        triton_build.launch(build, args)
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
        -1, so it writes no cache. Call before memory profiling and graph capture."""
        cfg, dev = self.cfg, self.device
        P, H = cfg.local_proj, cfg.hidden_size
        weights = {
            "ares_norm": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "ares_qk": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "in_norm": torch.zeros(H, dtype=torch.bfloat16, device=dev),
            "in_proj": torch.zeros(cfg.in_proj_rows, H, dtype=torch.bfloat16, device=dev),
            "f_b": torch.zeros(P, cfg.f_a_dim, dtype=torch.bfloat16, device=dev),
            "conv": torch.zeros(3 * P, 4, dtype=torch.float32, device=dev),
            "a_log": torch.zeros(cfg.local_heads, dtype=torch.float32, device=dev),
            "dt_bias": torch.zeros(P, dtype=torch.float32, device=dev),
            "o_norm": torch.zeros(cfg.kda_head_dim, dtype=torch.bfloat16, device=dev),
        }
        conv_state = torch.zeros(1, 3 * P, 3 + self.L - 1, dtype=torch.bfloat16, device=dev)
        state = torch.zeros(1, cfg.local_heads, cfg.kda_head_dim, cfg.kda_head_dim, device=dev)
        warmed = []
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
                    out=torch.empty(S, P, dtype=torch.bfloat16, device=dev),
                )
                warmed.append(self.build(r, delta, write))
        self.check()
        return warmed

    def error_word(self) -> int:
        """Bit i set: a stage-i wait gave up (a device read: call outside capture)."""
        return int(self.scratch[: 4 * (ERROR + 1)].view(torch.int32)[ERROR])

    def check(self) -> None:
        """Raise MonoFault if any launch since the last reset gave up a wait."""
        err = self.error_word()
        if err:
            from mono_runtime.errors import MonoFault

            from .spec import STAGES

            stages = [s for i, s in enumerate(STAGES) if err >> i & 1]
            raise MonoFault(
                f"K1 gave up waiting for stage(s) {', '.join(stages)} "
                f"(error word {err:#x}); call reset() before the next launch"
            )

    def reset(self) -> None:
        """Zero the scratch region (control and error words); no launch may be in flight."""
        self.scratch.zero_()
