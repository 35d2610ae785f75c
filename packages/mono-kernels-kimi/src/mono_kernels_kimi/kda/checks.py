"""K1's argument checks: every bad input raises ValueError naming the argument, before
any launch. Shapes, dtypes, strides and devices are checked always; slot and accepted
values (a device read) only when `values` is set, i.e. outside graph capture."""

from __future__ import annotations

import torch
from mono_runtime.kernel import same_device

from .spec import K1Build

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def _fail(name: str, why: str):
    raise ValueError(f"K1 argument `{name}`: {why}")


def _tensor(name, t, dtype, shape=None, device=None, dtypes=None):
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a tensor, got {type(t).__name__}")
    ok = dtypes or (dtype,)
    if t.dtype not in ok:
        _fail(name, f"dtype {t.dtype}, expected {' or '.join(map(str, ok))}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        _fail(name, f"shape {tuple(t.shape)}, expected {tuple(shape)}")
    if device is not None and not same_device(t.device, device):
        _fail(name, f"on {t.device}, expected {device} (every K1 tensor on one device)")


def _contiguous(name, t):
    if not t.is_contiguous():
        _fail(name, f"strides {t.stride()} are not contiguous for shape {tuple(t.shape)}")


def check_args(
    build: K1Build,
    *,
    prefix,
    delta,
    blocks,
    num_blocks: int,
    write_idx: int,
    weights: dict,
    conv_state,
    state,
    state_indices,
    num_accepted,
    out,
    scratch,
    values: bool = True,
) -> None:
    """Raises ValueError for anything K1 built as `build` cannot read or write safely."""
    S, H, P, D, NH = build.rows, build.hidden, build.local_proj, build.head_dim, build.heads
    R, L = build.requests, build.L
    _tensor("prefix", prefix, BF16, (S, H))
    dev = prefix.device
    _contiguous("prefix", prefix)
    if build.delta:
        if delta is None:
            _fail("delta", "None, but the build adds a prefix delta")
        _tensor("delta", delta, BF16, (S, H), dev)
        _contiguous("delta", delta)
    elif delta is not None:
        _fail("delta", "given, but the build has no prefix delta (the first layer)")
    _tensor("blocks", blocks, BF16, device=dev)
    if blocks.dim() != 3 or blocks.shape[0] != S or blocks.shape[2] != H:
        _fail("blocks", f"shape {tuple(blocks.shape)}, expected ({S}, blocks, {H})")
    if blocks.stride(2) != 1:
        _fail("blocks", "hidden dimension must be contiguous")
    if not 0 <= num_blocks <= blocks.shape[1] or num_blocks + 1 > build.max_sources:
        _fail(
            "num_blocks", f"{num_blocks} outside 0..{min(blocks.shape[1], build.max_sources - 1)}"
        )
    if build.write_block:
        if not num_blocks <= write_idx < blocks.shape[1]:
            _fail(
                "write_idx",
                f"{write_idx} outside {num_blocks}..{blocks.shape[1] - 1} "
                "(a block-write layer stores past the blocks it reads)",
            )
    elif write_idx != -1:
        _fail("write_idx", f"{write_idx}, but the build writes no block (expected -1)")
    expected = {
        "ares_norm": ((H,), (BF16,)),
        "ares_qk": ((H,), (BF16,)),
        "in_norm": ((H,), (BF16,)),
        "in_proj": ((build.in_proj_rows, H), (BF16,)),
        "f_b": ((P, build.f_a_dim), (BF16,)),
        "conv": ((3 * P, 4), (F32,)),
        "a_log": ((NH,), (F32,)),
        "dt_bias": ((P,), (F32,)),
        "o_norm": ((D,), (BF16, F32)),
    }
    for name, (shape, dtypes) in expected.items():
        if name not in weights:
            _fail(name, "missing from weights")
        _tensor(name, weights[name], None, shape, dev, dtypes)
        _contiguous(name, weights[name])
    _tensor("conv_state", conv_state, BF16, device=dev)
    min_len = 3 + L - 1
    if conv_state.dim() != 3 or conv_state.shape[1] != 3 * P or conv_state.shape[2] < min_len:
        _fail(
            "conv_state",
            f"shape {tuple(conv_state.shape)}, expected (slots, {3 * P}, >= "
            f"{min_len}) (vLLM's cache as [slots, dim, state_len])",
        )
    _tensor("state", state, F32, device=dev)
    if state.dim() != 4 or tuple(state.shape[1:]) != (NH, D, D):
        _fail("state", f"shape {tuple(state.shape)}, expected (slots, {NH}, {D}, {D})")
    if state.stride()[1:] != (D * D, D, 1):
        _fail("state", f"strides {state.stride()}: each slot must be a dense [{NH}, {D}, {D}]")
    if state.shape[0] != conv_state.shape[0]:
        _fail("state", f"{state.shape[0]} slots but conv_state has {conv_state.shape[0]}")
    _tensor("state_indices", state_indices, I32, device=dev)
    if build.spec:
        if state_indices.dim() != 2 or state_indices.shape[0] < R or state_indices.shape[1] < L:
            _fail("state_indices", f"shape {tuple(state_indices.shape)}, expected (>= {R}, >= {L})")
        if state_indices.stride(1) != 1:
            _fail("state_indices", "a request's slots must be contiguous")
        if num_accepted is None:
            _fail("num_accepted", "None, but a spec-verify build needs it")
        _tensor("num_accepted", num_accepted, I32, device=dev)
        if num_accepted.dim() != 1 or num_accepted.shape[0] < R or num_accepted.stride(0) != 1:
            _fail(
                "num_accepted", f"shape {tuple(num_accepted.shape)}, expected contiguous (>= {R},)"
            )
    else:
        if state_indices.dim() != 1 or state_indices.shape[0] < R:
            _fail("state_indices", f"shape {tuple(state_indices.shape)}, expected (>= {R},)")
        if num_accepted is not None:
            _fail("num_accepted", "given, but a plain-decode build takes none")
    _tensor("out", out, BF16, (S, P), dev)
    _contiguous("out", out)
    _tensor("scratch", scratch, torch.uint8, device=dev)
    if scratch.numel() < build.scratch_bytes or not scratch.is_contiguous():
        _fail(
            "scratch", f"{scratch.numel()} bytes, the build needs {build.scratch_bytes} contiguous"
        )
    if values:
        slots = state.shape[0]
        idx = state_indices[:R, :L] if build.spec else state_indices[:R]
        acc = num_accepted[:R] if build.spec else idx.new_ones(1)
        lo, hi, alo, ahi = torch.stack([idx.min(), idx.max(), acc.min(), acc.max()]).tolist()
        if lo < -1 or hi >= slots:
            _fail(
                "state_indices",
                f"values in {lo}..{hi}, expected -1..{slots - 1} (<= 0 marks padding)",
            )
        if alo < 1 or ahi > L:
            _fail("num_accepted", f"values in {alo}..{ahi}, expected 1..{L}")
