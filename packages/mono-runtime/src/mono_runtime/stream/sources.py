"""vLLM 0.33's post-load MXFP4 expert layouts, converted back to the checkpoint's ``mxfp4-k32``.

vLLM's MoE backends rewrite the loaded experts into their own layouts before the first
step; the kernels read ``mxfp4-k32`` (codes ``uint8[E, N, K/2]``, even k in the low
nibble; e8m0 scales ``uint8[E, N, K/32]``), which their weight bundles hold and their
runners' `pack` turns into the engine's ``mxfp4-rot``. Model-agnostic: the MiniMax-M3
FFN and Kimi-K3's K2 read their experts through it. Each layout here is a pure permutation of the
checkpoint's codes and scales (plus zero padding), so the conversion is exact:

- ``humming``: vLLM's HUMMING MXFP4 MoE backend (its default on Hopper) with bf16
  activations on SM90. Codes ``int32[E, Ks/16, 2 Ns]``: for each 16-wide K step, 64-row
  tiles whose words interleave rows and k as the ``weight_repack_nk`` CUDA kernel of the
  ``humming`` package writes them (4-bit weights, 16-bit activations, interleave mode 3).
  Scales ``e8m0[E, Ks/32, Ns]``: transposed, each 64 rows as an 8x8 transposed block.
  Ns, Ks: N padded to 256 and K to 128.
- ``aiter-a16w4``: vLLM's ``AITER_MXFP4_BF16`` backend (ROCm, gfx950): AITER's
  ``shuffle_weight(layout=(16, 16), is_guinterleave=True)`` codes (w13's gate and up
  halves interleaved per 16 rows) and ``shuffle_scale(is_guinterleave=True)`` scales.
- ``aiter-a4w4``: vLLM's ``AITER_MXFP4_MXFP4`` backend (the layout vLLM's own AMD
  MiniMax-M3 monokernel reads): ``shuffle_weight(layout=(16, 16))`` codes and
  ``e8m0_shuffle`` scales.
- ``mxfp4-k32``: the checkpoint's own (vLLM's EMULATION backend keeps it); only padding
  is dropped.

vLLM may pad each expert matrix (its backends round the intermediate size, HUMMING pads
N and K); `unpack_experts` returns the checkpoint's rows and columns only. It works one
expert at a time, so converting in place (the default) needs one expert's temporary, not
a second copy of the experts.
"""

from __future__ import annotations

import enum

import torch

from .layout import MX_GROUP as MX_BLOCK


class ExpertLayout(str, enum.Enum):
    K32 = "mxfp4-k32"
    HUMMING = "humming"
    AITER_A16W4 = "aiter-a16w4"
    AITER_A4W4 = "aiter-a4w4"


def unpack_experts(
    layout: ExpertLayout,
    codes: torch.Tensor,
    scales: torch.Tensor,
    n: int,
    k: int,
    *,
    up_row: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's ``mxfp4-k32`` (codes, scales) of one expert stack vLLM keeps in
    `layout`, for matrices of the checkpoint's `n` rows and `k` columns.

    `up_row`: for w13 (gate rows, then up rows), the stored row where the up half starts:
    vLLM pads the intermediate size of both halves (gate at rows 0.., up at `up_row`..);
    None for w2. `out`: uint8 tensors ``[E, n, k/2]`` and ``[E, n, k/32]`` to write;
    None converts in place, into the first bytes of `codes` and `scales` (whose contents
    are then gone). Raises ValueError naming the first thing that does not fit."""
    layout = ExpertLayout(layout)
    geometry = _Geometry.of(layout, codes, scales, n, k, up_row)
    e = codes.shape[0]
    if out is None:
        out = (_bytes(codes)[: e * n * k // 2].view(e, n, k // 2),
               _bytes(scales)[: e * n * k // MX_BLOCK].view(e, n, k // MX_BLOCK))  # fmt: skip
    else:
        _check_out(out, (e, n, k), (codes, scales))
    src_codes, src_scales = _bytes(codes), _bytes(scales)
    rows = geometry.rows(codes.device)
    cb, sb = geometry.code_bytes, geometry.scale_bytes
    for i in range(e):  # ascending: expert i's output never reaches a later expert's input
        full_codes = geometry.codes(src_codes[i * cb : (i + 1) * cb].clone())
        full_scales = geometry.scales(src_scales[i * sb : (i + 1) * sb].clone())
        out[0][i] = full_codes[rows, : k // 2]
        out[1][i] = full_scales[rows, : k // MX_BLOCK]
    return out


class _Geometry:
    """One expert's stored matrix: padded sizes ``ns`` x ``ks`` and the inverse
    permutation of `layout` from its bytes to ``[ns, ks/2]`` codes and ``[ns, ks/32]``
    scales."""

    def __init__(self, layout, ns, ks, n, k, up_row):
        self.layout, self.ns, self.ks, self.n, self.k, self.up_row = layout, ns, ks, n, k, up_row
        self.code_bytes, self.scale_bytes = ns * ks // 2, ns * ks // MX_BLOCK

    @classmethod
    def of(cls, layout, codes, scales, n, k, up_row) -> _Geometry:
        for name, t in (("codes", codes), ("scales", scales)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
            if not t.is_contiguous():
                raise ValueError(f"{name}: must be contiguous (strides {t.stride()})")
        if codes.dim() != 3:
            raise ValueError(f"codes: shape {tuple(codes.shape)}, expected 3 dims [E, ., .]")
        want = (torch.int32,) if layout is ExpertLayout.HUMMING else _BYTE_DTYPES
        if codes.dtype not in want:
            raise ValueError(f"codes: dtype {codes.dtype}, {layout.value} stores {want}")
        if scales.dtype not in (torch.uint8, torch.float8_e8m0fnu):
            raise ValueError(f"scales: dtype {scales.dtype}, expected uint8 or e8m0 codes")
        e = codes.shape[0]
        if layout is ExpertLayout.HUMMING:
            ks, ns = 16 * codes.shape[1], codes.shape[2] // 2
            scale_shape = (e, ks // MX_BLOCK, ns)
        else:
            ns, ks = codes.shape[1], 2 * codes.shape[2]
            scale_shape = (e, ns, ks // MX_BLOCK)
        shapes = [scale_shape]
        if layout in (ExpertLayout.AITER_A16W4, ExpertLayout.AITER_A4W4):
            shapes.append((e * ns, ks // MX_BLOCK))  # AITER shuffles scales as 2-D
        if tuple(scales.shape) not in shapes:
            raise ValueError(
                f"scales: shape {tuple(scales.shape)}, expected "
                f"{' or '.join(map(str, shapes))} for codes of shape {tuple(codes.shape)}"
            )
        geometry = cls(layout, ns, ks, n, k, up_row)
        geometry._check_fit()
        return geometry

    def _check_fit(self) -> None:
        ns, ks, n, k, up = self.ns, self.ks, self.n, self.k, self.up_row
        if k <= 0 or k % MX_BLOCK or k > ks:
            raise ValueError(f"k={k}: a positive multiple of {MX_BLOCK} up to the stored {ks}")
        if up is None and not 0 < n <= ns:
            raise ValueError(f"n={n}: expected 1..{ns} (the stored rows)")
        if up is not None and (n <= 0 or n % 2 or up < n // 2 or up + n // 2 > ns):
            raise ValueError(
                f"n={n}, up_row={up}: two halves of n/2 rows at rows 0 and up_row must fit "
                f"the stored {ns} rows"
            )
        need = {
            ExpertLayout.K32: (1, MX_BLOCK, 1),
            ExpertLayout.HUMMING: (64, MX_BLOCK, 1),
            ExpertLayout.AITER_A16W4: (32, 8 * MX_BLOCK, 1),
            ExpertLayout.AITER_A4W4: (32, 8 * MX_BLOCK, 1),
        }[self.layout]
        if ns % need[0] or ks % need[1]:
            raise ValueError(
                f"{self.layout.value}: stored [{ns}, {ks}] per expert, expected rows a "
                f"multiple of {need[0]} and columns of {need[1]}"
            )
        if self.layout is ExpertLayout.AITER_A16W4 and up is not None and up != ns // 2:
            raise ValueError(
                f"aiter-a16w4: up_row={up}, but AITER shuffles w13 as halves of {ns // 2} rows"
            )

    def rows(self, device) -> torch.Tensor:
        """The stored rows holding the checkpoint's, in its order."""
        if self.up_row is None:
            return torch.arange(self.n, device=device)
        half = torch.arange(self.n // 2, device=device)
        return torch.cat((half, half + self.up_row))

    def codes(self, b: torch.Tensor) -> torch.Tensor:
        """``mxfp4-k32`` codes ``[ns, ks/2]`` of one expert's stored bytes."""
        ns, ks, gate_up = self.ns, self.ks, self.up_row is not None
        if self.layout is ExpertLayout.K32:
            return b.view(ns, ks // 2)
        if self.layout is ExpertLayout.HUMMING:
            # nibble q of word c of K step r: word c = 128 bx + 16 ta + 4 tb + kk and
            # q = 4 qh + 2 ql1 + ql0 hold row 64 bx + 16 kk + 8 ql1 + ta, column
            # 16 r + 8 ql0 + 2 tb + qh
            nibbles = torch.stack((b & 0x0F, b >> 4), -1)
            tiles = nibbles.view(ks // 16, ns // 64, 8, 4, 4, 2, 2, 2)
            return _pack_nibbles(tiles.permute(1, 4, 6, 2, 0, 7, 3, 5).reshape(ns, ks))
        if self.layout is ExpertLayout.AITER_A4W4:
            # (row group of 16, 32-byte K block, 2, row, 16 bytes)
            return b.view(ns // 16, ks // 64, 2, 16, 16).permute(0, 3, 1, 2, 4).reshape(ns, -1)
        # aiter-a16w4: (row group of 16, [gate/up,] 64-byte K block, K lane, row, 16 bytes)
        if gate_up:
            tiles = b.view(ns // 32, 2, ks // 128, 4, 16, 16).permute(1, 0, 4, 2, 3, 5)
        else:
            tiles = b.view(ns // 16, ks // 128, 4, 16, 16).permute(0, 3, 1, 2, 4)
        return tiles.reshape(ns, ks // 2)

    def scales(self, b: torch.Tensor) -> torch.Tensor:
        """e8m0 scales ``[ns, ks/32]`` of one expert's stored bytes."""
        ns, groups = self.ns, self.ks // MX_BLOCK
        if self.layout is ExpertLayout.K32:
            return b.view(ns, groups)
        if self.layout is ExpertLayout.HUMMING:
            blocks = b.view(groups, ns // 64, 8, 8).transpose(-1, -2)
            return blocks.reshape(groups, ns).t()
        if self.layout is ExpertLayout.AITER_A4W4:
            # e8m0_shuffle: (32-row block, 8-group block, 4, 16, 2, 2)
            tiles = b.view(ns // 32, groups // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
            return tiles.reshape(ns, groups)
        # aiter-a16w4 shuffle_scale: (32-row block, 8-group block, K lane, row, K pack, N pack)
        tiles = b.view(ns // 32, groups // 8, 4, 16, 2, 2)
        order = (5, 0, 3, 1, 4, 2) if self.up_row is not None else (0, 5, 3, 1, 4, 2)
        return tiles.permute(*order).reshape(ns, groups)


_BYTE_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as flat bytes (no copy)."""
    return t.view(torch.uint8).reshape(-1)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[..., K]`` -> bytes ``[..., K/2]``, the even k in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _check_out(out, shape, sources) -> None:
    e, n, k = shape
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError("out: expected a tuple (codes, scales)")
    for name, t, want in (
        ("out codes", out[0], (e, n, k // 2)),
        ("out scales", out[1], (e, n, k // MX_BLOCK)),
    ):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or tuple(t.shape) != want:
            got = (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {got}, expected torch.uint8 {want}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
        for src in sources:
            if _overlap(t, src):
                raise ValueError(
                    f"{name}: overlaps the source tensors (leave out=None to convert in place)"
                )


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.device.type == "meta":  # meta tensors have no memory
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()
