"""One Kimi-K3 MoE layer's K2 weights as one TP rank holds them: the engine's tensors.

Shapes on one rank (H hidden, Ko = `o_proj_in`, LAT latent, E experts, RI / SI the routed /
shared intermediate of one rank), as vLLM 0.33 loads them (nvidia/model.py):

    o_proj        [H, Ko]        bf16  RowParallelLinear: this rank's K columns
    mlp_res_norm  [H]            bf16  the MLP AttnRes source norm (`mlp_res_norm`)
    mlp_res_proj  [H]            bf16  its query (`mlp_res_proj.weight[0]`)
    post_norm     [H]            bf16  `post_attention_layernorm` (the mix's output norm)
    router        [E, H]         bf16  `gate` (GateLinear: bf16 weight, fp32 logits), whole
    bias          [E]            fp32  `e_score_correction_bias` (selection only)
    latent_down   [LAT, H]       bf16  `routed_expert_down_proj` (replicated), whole
    latent_norm   [LAT]          bf16  `routed_expert_norm`
    up_proj       [H, LAT]       bf16  `routed_expert_up_proj` (replicated), whole
    shared_w13    [2 SI, H]      bf16  shared `gate_up_proj`: gate rows then up rows
    shared_w2     [H, SI]        bf16  shared `down_proj`: this rank's SI columns
    w13           [E, 2 RI, LAT/2] uint8 + w13_scale [E, 2 RI, LAT/32] uint8  (MXFP4)
    w2            [E, LAT, RI/2]   uint8 + w2_scale  [E, LAT, RI/32]   uint8  (MXFP4)

The router, latent_down and up_proj are whole on every rank (vLLM replicates them); K2
computes only this rank's share of each (`experts_per_rank`, `latent_per_rank`,
`hidden_per_rank` rows / columns) and all-gathers or reduces the rest in-kernel, so it
reads 1/TP of their bytes. The experts are ``mxfp4-k32`` as loaded (``rot`` False); the
Triton build streams ``mxfp4-rot``, into which `packed` converts them in place.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from mono_runtime.kernel import check_tensor
from mono_runtime.stream.experts import expert_layout, pack_experts, to_k32
from mono_runtime.stream.layout import MX_GROUP, quantize_mxfp4_k32, unpack_mxfp4_k32

from ..config import KimiK3Config

BF16, F32, U8 = torch.bfloat16, torch.float32, torch.uint8
EXPERTS = ("w13", "w2")


@dataclass(frozen=True)
class K2Weights:
    o_proj: torch.Tensor
    mlp_res_norm: torch.Tensor
    mlp_res_proj: torch.Tensor
    post_norm: torch.Tensor
    router: torch.Tensor
    bias: torch.Tensor
    latent_down: torch.Tensor
    latent_norm: torch.Tensor
    up_proj: torch.Tensor
    shared_w13: torch.Tensor
    shared_w2: torch.Tensor
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    rot: bool = False  # w13 and w2 in mxfp4-rot (False: the checkpoint's mxfp4-k32)
    frag: bool = False  # w13 and w2 in mxfp4-frag (the Gluon build's)

    @staticmethod
    def expected(cfg: KimiK3Config) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of every tensor at `cfg` (its tp)."""
        h, ko, lat, e = cfg.hidden_size, cfg.o_proj_in, cfg.latent_size, cfg.num_experts
        ri, si = cfg.routed_intermediate, cfg.shared_intermediate
        return {
            "o_proj": ((h, ko), BF16),
            "mlp_res_norm": ((h,), BF16),
            "mlp_res_proj": ((h,), BF16),
            "post_norm": ((h,), BF16),
            "router": ((e, h), BF16),
            "bias": ((e,), F32),
            "latent_down": ((lat, h), BF16),
            "latent_norm": ((lat,), BF16),
            "up_proj": ((h, lat), BF16),
            "shared_w13": ((2 * si, h), BF16),
            "shared_w2": ((h, si), BF16),
            "w13": ((e, 2 * ri, lat // 2), U8),
            "w13_scale": ((e, 2 * ri, lat // MX_GROUP), U8),
            "w2": ((e, lat, ri // 2), U8),
            "w2_scale": ((e, lat, ri // MX_GROUP), U8),
        }

    def validate(self, cfg: KimiK3Config, device: torch.device | None = None) -> None:
        """Raise ValueError naming the first tensor whose shape, dtype, layout or device
        differs from what K2 reads (another layer's, model's or TP's weights)."""
        for name, (shape, dtype) in self.expected(cfg).items():
            check_tensor(f"weights.{name}", getattr(self, name), shape, dtype, device)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("rot", "frag")
        }

    @property
    def expert_layout(self) -> str:
        return expert_layout(self.rot, self.frag)

    def dense(self, name: str, expert: int | None = None) -> torch.Tensor:
        """fp32 [E, N, K] of the routed experts `name` ("w13" or "w2"); with `expert`, that
        one's [N, K] alone (all of Kimi-K3's experts in fp32 are ~30 GB a rank)."""
        pick = slice(None) if expert is None else slice(expert, expert + 1)
        values, scales = getattr(self, name)[pick], getattr(self, f"{name}_scale")[pick]
        got = unpack_mxfp4_k32(*to_k32(values, scales, self.expert_layout))
        return got if expert is None else got[0]

    def packed(self, rot: bool, frag: bool = False) -> K2Weights:
        """This bundle with w13 and w2 in ``mxfp4-rot`` (`rot`), ``mxfp4-frag`` (`frag`) or
        as loaded (neither), converted in place: the engine's tensors are rewritten, never
        copied. One way."""
        want = expert_layout(rot, frag)
        if want == self.expert_layout:
            return self
        experts = {n: (getattr(self, n), getattr(self, f"{n}_scale")) for n in EXPERTS}
        pack_experts(experts, self.expert_layout, want)
        return replace(self, rot=rot and not frag, frag=frag)


def random_weights(
    cfg: KimiK3Config, seed: int = 0, rank: int = 0, device: str | torch.device = "cpu"
) -> K2Weights:
    """Rank `rank`'s random weights in the checkpoint formats. What vLLM replicates (norms,
    router, bias, latent_down, latent_norm, up_proj) comes from `seed` alone, the shards
    (o_proj, shared, experts) from (`seed`, `rank`). Magnitudes keep activations O(1) so that
    bf16 comparisons mean something."""
    h, ko, lat, e = cfg.hidden_size, cfg.o_proj_in, cfg.latent_size, cfg.num_experts
    ri, si = cfg.routed_intermediate, cfg.shared_intermediate
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std=1.0, mean=0.0):
        return mean + std * torch.randn(*shape, generator=g, device=device)

    def bf16(*shape, std=1.0, mean=0.0):
        return randn(*shape, std=std, mean=mean).to(BF16)

    whole = dict(
        mlp_res_norm=bf16(h, std=0.1, mean=1.0),
        mlp_res_proj=bf16(h, std=h**-0.5),
        post_norm=bf16(h, std=0.1, mean=1.0),
        router=bf16(e, h, std=h**-0.5),
        bias=randn(e, std=0.05),
        latent_down=bf16(lat, h, std=h**-0.5),
        latent_norm=bf16(lat, std=0.1, mean=1.0),
        up_proj=bf16(h, lat, std=lat**-0.5),
    )
    g.manual_seed(seed * 7919 + rank + 1_000_003)

    def experts(n, k):
        # one expert at a time: a full-size fp32 stack would not fit in memory
        parts = [quantize_mxfp4_k32(randn(n, k, std=k**-0.5)) for _ in range(e)]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])

    w13, w13_scale = experts(2 * ri, lat)
    w2, w2_scale = experts(lat, ri)
    return K2Weights(
        o_proj=bf16(h, ko, std=(ko * cfg.tp) ** -0.5),
        shared_w13=bf16(2 * si, h, std=h**-0.5),
        shared_w2=bf16(h, si, std=(si * cfg.tp) ** -0.5),
        w13=w13,
        w13_scale=w13_scale,
        w2=w2,
        w2_scale=w2_scale,
        **whole,
    )
