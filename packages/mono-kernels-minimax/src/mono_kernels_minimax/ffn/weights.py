"""One sparse layer's FFN weights as one TP rank holds them, zero-copy views of the engine's.

Shapes on a rank of TP ``tp`` (I = per-rank routed intermediate, Is = per-rank shared):

    norm       [H]              post_attention_layernorm weight (Gemma: x * (1 + w)), bf16
    router     [E, H]  fp32     GateLinear weight (vLLM keeps it fp32, fp32 logits)
    bias       [E]     fp32     e_score_correction_bias (selection only)
    w13        [E, 2I, K13]     gate rows then up rows of this rank's shard (un-interleaved)
    w2         [E, H, K2]       down projection, this rank's I columns
    shared_w13 [2Is, H], shared_w2 [H, Is]   the shared MLP (format: fmt.shared_format)
    *_scale    per format (formats.py); None for bf16

K13 = H (bf16, fp8) or H/2 bytes (mxfp4); K2 likewise over I.

MXFP4 experts arrive in the checkpoint's ``mxfp4-k32`` layout (``rot`` and ``frag``
False); the Triton build streams ``mxfp4-rot`` (mono_runtime.stream.layout), the Gluon
build ``mxfp4-frag`` (mono_runtime.stream.frag), into which `FfnRunner.pack` converts w13
and w2 once, in place (``rot`` or ``frag`` True). FP8 arrives in ``fp8-b128``, which the
Triton build streams as it is; for the Gluon build `FfnRunner.pack` moves the bytes of
w13, w2 and the shared expert's two matrices into ``fp8-frag`` (mono_runtime.stream.frag8;
``frag`` True), their scales untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from mono_runtime.kernel import check_tensor
from mono_runtime.stream.experts import FP8_FRAG, expert_layout, pack_experts, to_k32
from mono_runtime.stream.frag8 import pack_experts_fp8_frag, unpack_experts_fp8_frag

from ..config import MiniMaxM3Config
from ..formats import FP8_BLOCK, MX_BLOCK, WeightFormat, dequantize, quantize


@dataclass(frozen=True)
class FfnWeights:
    fmt: WeightFormat
    norm: torch.Tensor
    router: torch.Tensor
    bias: torch.Tensor
    w13: torch.Tensor
    w13_scale: torch.Tensor | None
    w2: torch.Tensor
    w2_scale: torch.Tensor | None
    shared_w13: torch.Tensor
    shared_w13_scale: torch.Tensor | None
    shared_w2: torch.Tensor
    shared_w2_scale: torch.Tensor | None
    rot: bool = False  # MXFP4 w13 and w2 in mxfp4-rot (False: the checkpoint's k32)
    frag: bool = False  # MXFP4 w13 and w2 in mxfp4-frag; FP8 all four matrices in fp8-frag

    def expected(self, cfg: MiniMaxM3Config, tp: int) -> dict[str, tuple]:
        """(shape, dtype) of every tensor for `cfg` at TP `tp` in this bundle's format."""
        h, e = cfg.hidden_size, cfg.num_experts
        i, si = cfg.per_rank_intermediate(tp), cfg.per_rank_shared_intermediate(tp)
        out = {
            "norm": ((h,), torch.bfloat16),
            "router": ((e, h), torch.float32),
            "bias": ((e,), torch.float32),
        }
        for name, lead, n, k, fmt in (
            ("w13", (e,), 2 * i, h, self.fmt),
            ("w2", (e,), h, i, self.fmt),
            ("shared_w13", (), 2 * si, h, self.fmt.shared_format),
            ("shared_w2", (), h, si, self.fmt.shared_format),
        ):
            out.update(_format_shapes(name, lead, n, k, fmt))
        return out

    def validate(self, cfg: MiniMaxM3Config, tp: int, device: torch.device | None = None) -> None:
        """Raise ValueError naming the first tensor whose shape, dtype, stride or device
        differs from what the kernel reads (e.g. another layer's or another TP's shapes)."""
        if not isinstance(self.fmt, WeightFormat):
            raise ValueError(f"weights.fmt: {self.fmt!r} is not a WeightFormat")
        for name, (shape, dtype) in self.expected(cfg, tp).items():
            t = getattr(self, name)
            if shape is None:
                if t is not None:
                    raise ValueError(f"weights.{name}: must be None for {self.fmt.value}")
                continue
            check_tensor(f"weights.{name}", t, shape, dtype, device)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        skip = ("fmt", "rot", "frag")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    @property
    def expert_layout(self) -> str:
        """The routed experts' layout: the format's own, or the packed one they are in."""
        if self.fmt is WeightFormat.MXFP4:
            return expert_layout(self.rot, self.frag)
        if self.fmt is WeightFormat.FP8 and self.frag:
            return FP8_FRAG
        return self.fmt.layout

    def dense(self, name: str) -> torch.Tensor:
        """fp32 dequantized view of a weight (w13, w2, shared_w13, shared_w2)."""
        fmt = self.fmt.shared_format if name.startswith("shared") else self.fmt
        values, scales = getattr(self, name), getattr(self, f"{name}_scale")
        if fmt is WeightFormat.MXFP4 and name in ("w13", "w2"):
            values, scales = to_k32(values, scales, self.expert_layout)
        if fmt is WeightFormat.FP8 and self.frag:
            values = unpack_experts_fp8_frag(values)
        return dequantize(values, scales, fmt)

    def packed(self, rot: bool, frag: bool = False) -> FfnWeights:
        """This bundle with w13 and w2 in ``mxfp4-rot`` (`rot`), ``mxfp4-frag`` (`frag`) or
        the checkpoint layout (neither), FP8 with `frag` in ``fp8-frag`` (all four matrices),
        converted in place: the engine's tensors are replaced, never copied. bf16 has no
        packed layout, and packing is one way."""
        if self.fmt is WeightFormat.FP8:
            if self.frag and not frag:
                raise ValueError(
                    f"weights: already packed as {FP8_FRAG}; the kernel wants fp8-b128"
                )
            if frag and not self.frag:
                names = ("w13", "w2", "shared_w13", "shared_w2")
                pack_experts_fp8_frag({n: getattr(self, n) for n in names})
                return replace(self, frag=True)
            return self
        want = expert_layout(rot, frag)
        if self.fmt is not WeightFormat.MXFP4 or want == self.expert_layout:
            return self
        experts = {n: (getattr(self, n), getattr(self, f"{n}_scale")) for n in ("w13", "w2")}
        pack_experts(experts, self.expert_layout, want)
        return replace(self, rot=rot and not frag, frag=frag)


def _format_shapes(name, lead, n, k, fmt):
    if fmt is WeightFormat.BF16:
        return {name: ((*lead, n, k), torch.bfloat16), f"{name}_scale": (None, None)}
    if fmt is WeightFormat.MXFP4:
        return {
            name: ((*lead, n, k // 2), torch.uint8),
            f"{name}_scale": ((*lead, n, k // MX_BLOCK), torch.uint8),
        }
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    return {
        name: ((*lead, n, k), torch.float8_e4m3fn),
        f"{name}_scale": ((*lead, nb, kb), torch.float32),
    }


def random_weights(
    cfg: MiniMaxM3Config,
    tp: int,
    fmt: WeightFormat,
    seed: int = 0,
    device: str | torch.device = "cpu",
    rank_seed: int | None = None,
) -> FfnWeights:
    """One rank's random weights in `fmt`. Norm, router and bias (replicated on every rank)
    come from `seed`; the expert shards from `rank_seed` (default: `seed`). Magnitudes keep
    activations O(1) so that bf16 comparisons are meaningful."""
    h, e = cfg.hidden_size, cfg.num_experts
    i, si = cfg.per_rank_intermediate(tp), cfg.per_rank_shared_intermediate(tp)
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std):
        return std * torch.randn(*shape, generator=g, device=device)

    norm = randn(h, std=0.1).to(torch.bfloat16)
    router = randn(e, h, std=h**-0.5)
    bias = randn(e, std=0.05)
    g.manual_seed(seed if rank_seed is None else rank_seed + 1_000_003)

    def expert_stack(n, k):
        # one expert at a time: full-size fp32 stacks would not fit in memory
        parts = [quantize(randn(n, k, std=k**-0.5), fmt) for _ in range(e)]
        vals = torch.stack([p[0] for p in parts])
        scales = None if parts[0][1] is None else torch.stack([p[1] for p in parts])
        return vals, scales

    q13, s13 = expert_stack(2 * i, h)
    q2, s2 = expert_stack(h, i)
    qs13, ss13 = quantize(randn(2 * si, h, std=h**-0.5), fmt.shared_format)
    qs2, ss2 = quantize(randn(h, si, std=si**-0.5), fmt.shared_format)
    return FfnWeights(fmt, norm, router, bias, q13, s13, q2, s2, qs13, ss13, qs2, ss2)
