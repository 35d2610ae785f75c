"""The runtime's benchmark pieces on a CPU: the grouped-GEMM experts of the op-by-op
baselines against a loop over experts, random stored MXFP4 weights, the bf16 copies, the
routing rule and the printed table."""

from __future__ import annotations

import pytest
import torch
from mono_runtime.opbyop import bf16_copy, grouped_experts
from mono_runtime.report import fixed_width
from mono_runtime.routing import sigmoid_topk
from mono_runtime.stream.layout import (
    MXFP4_K32,
    dequantize,
    quantize_mxfp4_k32,
    random_mxfp4_k32,
)

pytestmark = pytest.mark.timeout(60)


def act(gu: torch.Tensor) -> torch.Tensor:
    d = gu.shape[-1] // 2
    return (torch.nn.functional.silu(gu[..., :d].float()) * gu[..., d:].float()).bfloat16()


def test_grouped_experts_is_a_loop_over_experts():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).bfloat16()
    w13 = (torch.randn(8, 32, 64, generator=g) / 8).bfloat16()
    w2 = (torch.randn(8, 48, 16, generator=g) / 4).bfloat16()
    ids = torch.tensor([[1, 2], [2, 5], [7, 1]])
    wt = torch.rand(3, 2, generator=g)
    got = grouped_experts(x, ids, wt, w13, w2, act)
    want = torch.zeros(3, 48)
    for s in range(3):
        for j in range(2):
            e = int(ids[s, j])
            h = act((x[s : s + 1].float() @ w13[e].float().t()).bfloat16())
            want[s] += wt[s, j] * (h.float() @ w2[e].float().t())[0]
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)


def test_random_mxfp4_has_the_asked_std_and_bf16_copy_dequantizes():
    g = torch.Generator().manual_seed(1)
    codes, scales = random_mxfp4_k32((4, 64, 256), 256**-0.5, g)
    assert codes.shape == (4, 64, 128) and scales.shape == (4, 64, 8)
    dense = bf16_copy(codes, scales, MXFP4_K32, chunk=3)
    assert torch.equal(dense, dequantize(codes, scales, MXFP4_K32).bfloat16())
    assert 0.5 < dense.float().std().item() * 16 < 2.0
    with pytest.raises(ValueError, match="multiple of 32"):
        random_mxfp4_k32((4, 40), 1.0, g)
    w = torch.randn(8, 64, generator=g)
    back = dequantize(*quantize_mxfp4_k32(w), MXFP4_K32)
    assert (back - w).norm() / w.norm() < 0.2  # e2m1 with a shared scale a group of 32


def test_sigmoid_topk_ties_go_to_the_lower_id_and_nan_last():
    logits = torch.tensor([[0.0, 1.0, 1.0, float("nan"), -1.0]])
    ids, w = sigmoid_topk(logits, torch.zeros(5), 3, scaling=2.0)
    assert ids.tolist() == [[1, 2, 0]]
    assert torch.allclose(w.sum(-1), torch.tensor([2.0]))


def test_fixed_width_table():
    rows = [dict(a=1, b=2.5), dict(a=10, b=None)]
    text = fixed_width(rows, (("a", "{}"), ("b", "{:.2f}")), ["a note"])
    assert text.splitlines() == [" a     b", " 1  2.50", "10     -", "a note"]
