"""vLLM's post-load expert layouts back to the checkpoint's mxfp4-k32 (mono_runtime.stream.sources).

The layouts are made here the way vLLM 0.33 makes them, then unpacked and compared bit for
bit with the checkpoint:

- HUMMING: vLLM's own `convert_to_humming_moe_kernel_format` runs on the CPU (its device
  queries answered as an SM90 GPU); its one CUDA kernel, humming's ``weight_repack_nk``
  (humming/include/humming/kernel/process.cuh), is replaced by `humming_repack`, a
  transcription of its index arithmetic for the flags vLLM passes (4-bit weights, 16-bit
  activations, packed input, interleave mode 3). The GPU test checks the transcription
  against the CUDA kernel itself.
- AITER: AITER needs ROCm, so `aiter_shuffle_weight`, `aiter_shuffle_scale` and
  `aiter_e8m0_shuffle` transcribe ``aiter/ops/shuffle.py`` and
  ``aiter/utility/fp4_utils.py`` (ROCm/aiter, commit 0122c48); vLLM's own
  `convert_weight_to_mxfp4_moe_kernel_format` runs over them (a stand-in ``aiter``
  module), so vLLM's choice of functions and flags is vLLM's.

Then the FFN kernel (interpreter, tiny config) runs on experts unpacked from each source
against the reference on the unpacked weights.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import replace
from unittest import mock

import pytest
import torch
from mono_runtime.stream.sources import ExpertLayout, unpack_experts

ENV = {"TRITON_INTERPRET": "1"}


# -- the layouts, transcribed ---------------------------------------------------------------
def humming_repack(inputs: torch.Tensor, **flags) -> torch.Tensor:
    """``weight_repack_nk<4, 16, packed>`` over int32 ``[E, N, K/8]`` -> int32
    ``[E, K/16, 2N]``: each output nibble's source, computed with the kernel's own
    expressions (block bx, by, bz; thread t; its tmp array [4][1][4][2][2][2]; the pack
    loop's interleaved index; the store loop's row and column)."""
    assert flags["interleave_mode"] == 3 and flags.get("zero_point") is None
    for off in ("should_preprocess_for_int2fp", "should_preprocess_with_zp",
                "use_fused_e8m0_scale", "use_packed_k_layout", "use_native_dequant"):  # fmt: skip
        assert not flags.get(off), off
    e, n, words = inputs.shape
    k = words * 8
    src = inputs.contiguous().view(torch.uint8)
    src = torch.stack((src & 15, src >> 4), -1).reshape(e, n, k)  # nibble k of row n
    g = torch.meshgrid(
        torch.arange(e), torch.arange(k // 64), torch.arange(n // 64), torch.arange(4),
        torch.arange(32), torch.arange(4), torch.arange(8), indexing="ij",
    )  # fmt: skip
    bz, by, bx, i_out, t, col_k, q = g  # store loops: i (row), k (int), nibble q of the int
    new_q = 2 * (q % 4) + q // 4  # get_interleaved_index (N = 8, stride = 2)
    idx = i_out * 32 + col_k * 8 + new_q  # humming_pack_weight reads in_arr[i*32 + j*8 + new_k]
    i1, i3, i4, i5, i6 = idx // 32, idx // 8 % 4, idx // 4 % 2, idx // 2 % 2, idx % 2
    j, i, kk = 2 * i1 + i5, 2 * i3 + i4, i6  # the fill loop's j, i, k that stored tmp[idx]
    row = i * 8 + t // 4
    index = j * 8 + (t % 4) * 2 + kk
    value = src[bz, 64 * bx + row, 64 * by + index]
    out_row = by * 4 + i_out  # (blockIdx.y * 64 + blockIdx.z * padded_k) / 16 + i, per expert
    out_col = 128 * bx + t * 4 + col_k
    out = torch.zeros(e, k // 16, 2 * n, 8, dtype=torch.uint8)
    out[bz, out_row, out_col, q] = value
    return (out[..., 0::2] | (out[..., 1::2] << 4)).view(torch.int32).reshape(e, k // 16, 2 * n)


def aiter_shuffle_weight(x, layout=(16, 16), use_int4=False, is_guinterleave=False, gate_up=False):
    """aiter.ops.shuffle.shuffle_weight."""
    x_type = x.dtype
    if x_type == torch.float4_e2m1fn_x2:
        x = x.view(torch.uint8)
    if is_guinterleave:
        e, n, k_pk = x.shape
        n = n // 2 if gate_up else n
        n_lane, k_pack = layout
        k_lane = 64 // n_lane
        n0, k0 = n // n_lane, k_pk // (k_lane * k_pack)
        if gate_up:
            x_ = x.view(e, 2, n0, n_lane, k0, k_lane, k_pack).permute(0, 2, 1, 4, 5, 3, 6)
        else:
            x_ = x.view(e, n0, n_lane, k0, k_lane, k_pack).permute(0, 1, 3, 4, 2, 5)
        return x_.contiguous().view(*x.shape).view(x_type)
    bn, bk = layout[0], layout[1] * 2
    kk = 16 // x.element_size() if not use_int4 else 32
    x_ = x.view(-1, x.shape[-2] // bn, bn, x.shape[-1] // bk, bk // kk, kk)
    return x_.permute(0, 1, 3, 4, 2, 5).contiguous().view(*x.shape).view(x_type)


def aiter_e8m0_shuffle(scale):
    """aiter.utility.fp4_utils.e8m0_shuffle (= shuffle_scale without gate/up interleave)."""
    m, n = scale.shape
    padded = torch.empty((m + 255) // 256 * 256, (n + 7) // 8 * 8, dtype=scale.dtype)
    padded[:m, :n] = scale
    sm, sn = padded.shape
    out = padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1)
    return out.contiguous().view(sm, sn)


def aiter_shuffle_scale(src, experts_cnt=None, is_guinterleave=False, gate_up=False):
    """aiter.ops.shuffle.shuffle_scale."""
    if not is_guinterleave:
        return aiter_e8m0_shuffle(src)
    n_experts, k_ = src.shape
    n_ = n_experts // experts_cnt
    k1, n1 = k_ // 2 // 4, n_ // 16 // 2
    if gate_up:
        s = src.view(experts_cnt, 2, n1, 16, k1, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)
    else:
        s = src.view(experts_cnt, n1, 2, 16, k1, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
    return s.contiguous().view(*src.shape)


@contextlib.contextmanager
def stand_in_aiter():
    """An ``aiter`` module holding the transcriptions (vLLM imports them lazily)."""
    shuffle = types.SimpleNamespace(shuffle_weight=aiter_shuffle_weight,
                                    shuffle_scale=aiter_shuffle_scale)  # fmt: skip
    fp4 = types.SimpleNamespace(e8m0_shuffle=aiter_e8m0_shuffle)
    modules = {
        "aiter": types.ModuleType("aiter"),
        "aiter.ops": types.ModuleType("aiter.ops"),
        "aiter.ops.shuffle": shuffle,
        "aiter.utility": types.ModuleType("aiter.utility"),
        "aiter.utility.fp4_utils": fp4,
    }
    with mock.patch.dict(sys.modules, modules), mock.patch.dict("os.environ"):
        yield


# -- checkpoint experts, padded as vLLM loads them ------------------------------------------
def checkpoint(e, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 140, (e, n, k // 32), generator=g, dtype=torch.uint8)
    return codes, scales


def loaded(w13, w2, inter_pad):
    """vLLM's loaded tensors when its backend rounds the intermediate size up to
    `inter_pad`: each w13 half at its own offset, w2's columns past I zero."""
    (c13, s13), (c2, s2) = w13, w2
    e, two_i, h2 = c13.shape
    i = two_i // 2
    c13p = torch.zeros(e, 2 * inter_pad, h2, dtype=torch.uint8)
    s13p = torch.zeros(e, 2 * inter_pad, s13.shape[-1], dtype=torch.uint8)
    for half in range(2):
        rows = slice(half * inter_pad, half * inter_pad + i)
        c13p[:, rows], s13p[:, rows] = (
            c13[:, half * i : (half + 1) * i],
            s13[:, half * i : (half + 1) * i],
        )
    c2p = torch.zeros(e, c2.shape[1], inter_pad // 2, dtype=torch.uint8)
    s2p = torch.zeros(e, c2.shape[1], inter_pad // 32, dtype=torch.uint8)
    c2p[..., : i // 2], s2p[..., : i // 32] = c2, s2
    return (c13p, s13p), (c2p, s2p)


# -- vLLM's conversions on the CPU -----------------------------------------------------------
class _Experts(torch.nn.Module):
    """The parameters and config vLLM's conversions read from a RoutedExperts."""

    def __init__(self, w13, w2, inter):
        super().__init__()
        for name, t in (("w13_weight", w13[0]), ("w13_weight_scale", w13[1]),
                        ("w2_weight", w2[0]), ("w2_weight_scale", w2[1])):  # fmt: skip
            self.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))
        e, hidden = w13[0].shape[0], w2[0].shape[1]
        self.moe_config = types.SimpleNamespace(
            has_bias=False, num_local_experts=e, activation=types.SimpleNamespace(is_gated=True),
            intermediate_size_per_partition=inter, hidden_dim=hidden,
        )  # fmt: skip
        self.params_dtype = torch.bfloat16
        self.layer_name = "model.layers.1.block_sparse_moe.experts"


def vllm_humming(w13, w2, inter):
    """vLLM's HUMMING conversion of the loaded experts (as on an H200, bf16 activations)."""
    pytest.importorskip("vllm")
    pytest.importorskip("humming")
    import humming.device
    import humming.transform
    import vllm.model_executor.layers.quantization.utils.humming.schema as vllm_schema
    from vllm.model_executor.layers.quantization.utils.humming import (
        convert_to_humming_moe_kernel_format,
    )
    from vllm.platforms.interface import DeviceCapability

    sm90 = types.SimpleNamespace(is_ppu=False, sm_version=90, sm_major=9)
    platform = types.SimpleNamespace(get_device_capability=lambda *_: DeviceCapability(9, 0))
    layer = _Experts(w13, w2, inter)
    with contextlib.ExitStack() as stack:
        for target, name, value in (
            (humming.device.current_device, "_value", sm90),
            (humming.transform, "DeviceInfo", lambda *_: sm90),
            (humming.transform.ops, "repack_weight", humming_repack),
            (vllm_schema, "current_platform", platform),
            (torch.cuda, "device", lambda *_: contextlib.nullcontext()),
        ):
            stack.enter_context(mock.patch.object(target, name, value))
        convert_to_humming_moe_kernel_format(
            layer, quant_config={"quant_method": "mxfp4"}, allow_input_schema_fallback=False
        )
    return layer


def vllm_aiter(w13, w2, backend):
    """vLLM's conversion for an AITER MXFP4 backend (its ROCm path, AITER transcribed)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
        Mxfp4MoeBackend,
        convert_weight_to_mxfp4_moe_kernel_format,
    )

    layer = _Experts(w13, w2, w13[0].shape[1] // 2)
    with stand_in_aiter():
        c13, c2, s13, s2, _, _ = convert_weight_to_mxfp4_moe_kernel_format(
            Mxfp4MoeBackend[backend], layer, layer.w13_weight, layer.w2_weight,
            layer.w13_weight_scale, layer.w2_weight_scale,
            activation=MoEActivation.SWIGLUOAI_UNINTERLEAVE,
        )  # fmt: skip
    return (c13.data, s13.data), (c2.data, s2.data)


# -- unpacking what vLLM made ----------------------------------------------------------------
E, H = 2, 256


def _assert_unpacks(layout, stored13, stored2, w13, w2, up_row, in_place):
    i = w13[0].shape[1] // 2
    for stored, want, n, k, up in ((stored13, w13, 2 * i, H, up_row), (stored2, w2, H, i, None)):
        out = None if in_place else (torch.empty_like(want[0]), torch.empty_like(want[1]))
        codes, scales = unpack_experts(layout, *stored, n, k, up_row=up, out=out)
        assert torch.equal(codes, want[0]) and torch.equal(scales, want[1]), (layout, n, k)
        if in_place:
            assert codes.data_ptr() == stored[0].data_ptr()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inter", [64, 128])
def test_humming_from_vllms_conversion(inter):
    """I = 64: vLLM pads w13's rows to 256 and w2's K to 128 (128: no padding)."""
    w13, w2 = checkpoint(E, 2 * inter, H, 1), checkpoint(E, H, inter, 2)
    layer = vllm_humming(w13, w2, inter)
    stored13 = (layer.w13_weight.data, layer.w13_weight_scale.data)
    stored2 = (layer.w2_weight.data, layer.w2_weight_scale.data)
    assert stored13[0].dtype == torch.int32 and stored13[1].dtype == torch.float8_e8m0fnu
    _assert_unpacks(ExpertLayout.HUMMING, stored13, stored2, w13, w2, inter, in_place=False)
    _assert_unpacks(ExpertLayout.HUMMING, stored13, stored2, w13, w2, inter, in_place=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend,layout,inter,inter_pad",
    [
        # vLLM rounds MiniMax-M3's intermediate size to 256 for AITER_MXFP4_BF16 on ROCm
        ("AITER_MXFP4_BF16", ExpertLayout.AITER_A16W4, 128, 256),
        ("AITER_MXFP4_BF16", ExpertLayout.AITER_A16W4, 256, 256),
        ("AITER_MXFP4_MXFP4", ExpertLayout.AITER_A4W4, 256, 256),
    ],
)
def test_aiter_from_vllms_conversion(backend, layout, inter, inter_pad):
    w13, w2 = checkpoint(E, 2 * inter, H, 3), checkpoint(E, H, inter, 4)
    stored13, stored2 = vllm_aiter(*loaded(w13, w2, inter_pad), backend)
    assert stored13[0].dtype == torch.float4_e2m1fn_x2
    for in_place in (False, True):
        _assert_unpacks(layout, stored13, stored2, w13, w2, inter_pad, in_place)
        if not in_place:
            continue
        stored13, stored2 = vllm_aiter(*loaded(w13, w2, inter_pad), backend)


def test_checkpoint_layout_drops_padding_only():
    w13, w2 = checkpoint(E, 64, H), checkpoint(E, H, 32)
    (c13, s13), (c2, s2) = loaded(w13, w2, 64)
    _assert_unpacks(ExpertLayout.K32, (c13, s13), (c2, s2), w13, w2, 64, in_place=False)
    c13c = c13.clone()
    codes, _ = unpack_experts(ExpertLayout.K32, c13c, s13.clone(), 128, H, up_row=64)
    assert torch.equal(codes, c13)  # nothing to drop: the same bytes, in place


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(k=48), "k=48: a positive multiple of 32"),
        (dict(n=300), "n=300: expected 1..256"),
        (dict(n=64, up_row=240), "two halves of n/2 rows"),
        (dict(n=64, up_row=100), "AITER shuffles w13 as halves of 128 rows"),
        (dict(codes=torch.zeros(2, 256, 128, dtype=torch.int32)), "aiter-a16w4 stores"),
        (dict(scales=torch.zeros(2, 256, 7, dtype=torch.uint8)), "scales: shape (2, 256, 7)"),
        (
            dict(
                codes=torch.zeros(2, 256, 64, dtype=torch.uint8),
                k=128,
                scales=torch.zeros(512, 4, dtype=torch.uint8),
            ),
            "columns of 256",
        ),  # fmt: skip
        (dict(out=(torch.zeros(2, 256, 128, dtype=torch.uint8),)), "out: expected a tuple"),
    ],
)
def test_bad_input_names_the_problem(change, message):
    args = dict(
        codes=torch.zeros(2, 256, 128, dtype=torch.uint8),
        scales=torch.zeros(2 * 256, 8, dtype=torch.uint8),
        n=256, k=256, up_row=None, out=None,
    )  # fmt: skip
    args.update(change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        unpack_experts(
            ExpertLayout.AITER_A16W4, args["codes"], args["scales"], args["n"], args["k"],
            up_row=args["up_row"], out=args["out"],
        )  # fmt: skip


def test_out_overlapping_the_source_is_refused():
    codes, scales = checkpoint(E, H, H)
    with pytest.raises(ValueError, match="overlaps the source"):
        unpack_experts(ExpertLayout.K32, codes, scales, H, H, out=(codes, scales.clone()))


# -- through the FFN kernel ------------------------------------------------------------------
def humming_scales(scales):
    """vLLM's HUMMING scale transform (humming's ``transform_humming_weight_scale`` for group
    scales, bf16 activations, not a PPU): transposed, each 64 rows an 8x8 transposed block."""
    t = scales.transpose(-1, -2).contiguous()
    perm = torch.tensor([8 * b + a for a in range(8) for b in range(8)])
    return t.view(-1, 64)[:, perm].reshape(t.shape).view(torch.float8_e8m0fnu)


def stored_as(layout, w13, w2, inter_pad):
    """Checkpoint experts as vLLM keeps them in `layout` after load (`inter_pad`: the
    intermediate size its backend rounds to)."""
    (c13, s13), (c2, s2) = loaded(w13, w2, inter_pad)
    if layout is ExpertLayout.K32:
        return (c13, s13), (c2, s2)
    if layout is ExpertLayout.HUMMING:
        return tuple(
            (humming_repack(c.view(torch.int32), interleave_mode=3), humming_scales(s))
            for c, s in ((c13, s13), (c2, s2))
        )
    e = c13.shape[0]
    return tuple(
        (aiter_shuffle_weight(c, is_guinterleave=True, gate_up=gate_up),
         aiter_shuffle_scale(s.reshape(-1, s.shape[-1]), e, True, gate_up))
        for c, s, gate_up in ((c13, s13, True), (c2, s2, False))
    )  # fmt: skip


# the intermediate size vLLM rounds I = 128 (tiny, TP1) to: EMULATION 32, HUMMING 64, and
# 256 for AITER_MXFP4_BF16 on ROCm
SOURCES = {ExpertLayout.K32: 128, ExpertLayout.HUMMING: 128, ExpertLayout.AITER_A16W4: 256}


def kernel_on_sources(rank, world, group, device="cpu"):
    """Child: tiny MXFP4 experts stored in each source layout (transcriptions), unpacked in
    place on `device` and packed for the kernel; one step (a real row, a padding row)
    against the reference on the unpacked weights."""
    from mono_kernels_minimax.config import MiniMaxM3Config
    from mono_kernels_minimax.ffn.reference import ffn_reference
    from mono_kernels_minimax.ffn.runner import FfnRunner
    from mono_kernels_minimax.ffn.weights import random_weights
    from mono_kernels_minimax.formats import WeightFormat

    cfg = MiniMaxM3Config.tiny()
    h, i = cfg.hidden_size, cfg.per_rank_intermediate(1)
    w = random_weights(cfg, 1, WeightFormat.MXFP4, seed=5)
    g = torch.Generator().manual_seed(9)
    parts = [torch.randn(2, h, generator=g).bfloat16().to(device)]
    residual = torch.randn(2, h, generator=g).bfloat16().to(device)
    slots = torch.tensor([0, -1], device=device)
    on = {name: t.to(device) for name, t in w.tensors().items() if t is not None}
    w = replace(w, **on)
    runner = FfnRunner(cfg, WeightFormat.MXFP4, group, rank, world, device, widths=[2])
    records = {}
    try:
        for layout, inter_pad in SOURCES.items():
            stored = stored_as(layout, (w.w13.cpu(), w.w13_scale.cpu()),
                               (w.w2.cpu(), w.w2_scale.cpu()), inter_pad)  # fmt: skip
            (s13, s2) = ((c.to(device), sc.to(device)) for c, sc in stored)
            c13, sc13 = unpack_experts(layout, *s13, 2 * i, h, up_row=inter_pad)
            c2, sc2 = unpack_experts(layout, *s2, h, i)
            pairs = ((c13, w.w13), (sc13, w.w13_scale), (c2, w.w2), (sc2, w.w2_scale))
            exact = all(torch.equal(a, b) for a, b in pairs)  # before packing, in place
            unpacked = replace(w, w13=c13, w13_scale=sc13, w2=c2, w2_scale=sc2)
            ref = ffn_reference(cfg, parts, residual, [unpacked], slots)
            runner.step_begin()
            out, _ = runner(parts[0], residual, runner.pack(unpacked), slots)
            runner.after_step()
            records[layout.value] = dict(
                exact=exact,
                err=float((out.float() - ref.out.float()).norm() / ref.out.float().norm()),
                pad_zero=bool((out[1] == 0).all()),
            )
    finally:
        runner.close()
    return records


def _check_sources(records):
    assert set(records) == {layout.value for layout in SOURCES}
    for layout, r in records.items():
        assert r["exact"], f"{layout}: unpacking did not restore the checkpoint bit for bit"
        assert r["err"] < 1e-2, f"{layout}: kernel vs reference rel-L2 {r['err']}"
        assert r["pad_zero"], f"{layout}: the padding row got a MoE output"


@pytest.mark.timeout(300)
def test_ffn_kernel_on_experts_from_every_source():
    from mono_peer.testing import spawn

    _check_sources(spawn(kernel_on_sources, 1, 280, env=ENV)[0])


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_ffn_kernel_on_experts_from_every_source_gpu():
    """The same on a GPU: the HUMMING experts are made by `humming_repack` (no vLLM there)."""
    from mono_peer.testing import spawn

    _check_sources(spawn(kernel_on_sources, 1, 280, "cuda")[0])


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_humming_repack_transcription_is_hummings_cuda_kernel():
    """`humming_repack` against humming's own CUDA ``weight_repack_nk`` (vLLM's flags)."""
    if torch.version.hip:
        pytest.skip("humming's kernels are CUDA")
    ops = pytest.importorskip("humming.ops")
    for n, k in ((256, 256), (512, 128)):
        codes = checkpoint(E, n, k)[0].view(torch.int32)
        got = ops.repack_weight(
            codes.cuda(), weight_bits=4, activation_bits=16, is_weight_packed=True,
            interleave_mode=3,
        )  # fmt: skip
        assert torch.equal(got.cpu(), humming_repack(codes, interleave_mode=3)), (n, k)
