"""Random per-rank inputs of one KDA layer in vLLM 0.33's layouts: for tests and benchmarks.

Layouts (from `KimiK3DeltaAttention` and `MambaStateShapeCalculator.kda_state_shape`):
in_proj [rows, hidden] bf16 with zero padding rows; f_b [local_proj, head_dim] bf16;
conv1d weight [3 * local_proj, 1, 4] fp32, passed as its [3 * local_proj, 4] view;
A_log [local_heads] fp32; dt_bias [local_proj] fp32; o_norm weight [head_dim] bf16;
conv state cache [slots, 3 + num_spec, 3 * local_proj] bf16 in the default "SD" layout
(or [slots, dim, state_len] for "DS"), given to the kernels as [slots, dim, state_len];
recurrent state [slots, local_heads, head_dim (v), head_dim (k)] fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..config import KimiK3Config

WEIGHTS = (
    "ares_norm",
    "ares_qk",
    "in_norm",
    "in_proj",
    "f_b",
    "conv",
    "a_log",
    "dt_bias",
    "o_norm",
)


@dataclass
class LayerInputs:
    """Everything K1 reads or writes for one launch (tensors are cloned together)."""

    cfg: KimiK3Config
    R: int
    L: int
    num_blocks: int
    write_idx: int
    prefix: torch.Tensor
    delta: torch.Tensor | None
    blocks: torch.Tensor
    weights: dict[str, torch.Tensor]
    conv_cache: torch.Tensor  # as vLLM allocates it (SD or DS)
    conv_layout: str
    state: torch.Tensor
    state_indices: torch.Tensor
    num_accepted: torch.Tensor | None
    out: torch.Tensor = field(default=None)  # type: ignore[assignment]

    @property
    def conv_state(self) -> torch.Tensor:
        """[slots, dim, state_len], the orientation vLLM's conv kernels consume."""
        return self.conv_cache.transpose(-1, -2) if self.conv_layout == "SD" else self.conv_cache

    def clone(self) -> LayerInputs:
        vals = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v.clone()
            elif isinstance(v, dict):
                v = {k: t.clone() for k, t in v.items()}
            vals[f.name] = v
        return LayerInputs(**vals)

    def k1_kwargs(self) -> dict:
        """The keywords of a `KdaRunner` call on this bundle (`runner(x.R, **x.k1_kwargs())`),
        so benchmarks and tests name K1's arguments in one place."""
        return dict(
            prefix=self.prefix,
            delta=self.delta,
            blocks=self.blocks,
            num_blocks=self.num_blocks,
            write_idx=self.write_idx,
            weights=self.weights,
            conv_state=self.conv_state,
            state=self.state,
            state_indices=self.state_indices,
            num_accepted=self.num_accepted,
            out=self.out,
        )

    def reference(self, exact: bool = True) -> torch.Tensor:
        from .reference import kda_layer

        return kda_layer(
            self.cfg,
            prefix=self.prefix,
            delta=self.delta,
            blocks=self.blocks,
            num_blocks=self.num_blocks,
            write_idx=self.write_idx,
            w=self.weights,
            conv_state=self.conv_state,
            state=self.state,
            state_indices=self.state_indices,
            num_accepted=self.num_accepted,
            L=self.L,
            exact=exact,
        )


def make_weights(cfg: KimiK3Config, device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    H, P = cfg.hidden_size, cfg.local_proj
    in_proj = torch.randn(cfg.in_proj_rows, H, generator=gen) * H**-0.5
    in_proj[cfg.in_proj_rows_unpadded :] = 0
    return {
        "ares_norm": randn(H, scale=0.1) + 1,
        "ares_qk": randn(H, scale=H**-0.5 * 4),
        "in_norm": randn(H, scale=0.1) + 1,
        "in_proj": in_proj.to(torch.bfloat16).to(device),
        "f_b": randn(P, cfg.f_a_dim, scale=cfg.f_a_dim**-0.5),
        "conv": (torch.rand(3 * P, 4, generator=gen) - 0.5).to(device),
        "a_log": randn(cfg.local_heads, scale=0.5, dtype=torch.float32),
        "dt_bias": randn(P, dtype=torch.float32),
        "o_norm": randn(cfg.kda_head_dim, scale=0.1) + 1,
    }


def make_inputs(
    cfg: KimiK3Config,
    R: int,
    L: int,
    *,
    spec: bool = True,
    layer_idx: int = 1,
    delta: bool = True,
    pad: tuple[int, ...] = (),
    pad_slot: int = -1,
    conv_layout: str = "SD",
    spare_slots: int = 3,
    device="cpu",
    seed: int = 0,
    weights: dict[str, torch.Tensor] | None = None,
) -> LayerInputs:
    """Fresh random inputs for R requests of L rows. `pad` lists requests that are
    padding (every slot `pad_slot`); the other requests get distinct random slots
    (never 0, vLLM's null block) and a random accepted count in 1..L (spec)."""
    if not spec and L != 1:
        raise ValueError("a plain decode has L = 1")
    gen = torch.Generator().manual_seed(seed)
    S, H = R * L, cfg.hidden_size
    nb, wi = cfg.attn_res_blocks(layer_idx)
    total_blocks = cfg.num_attn_res_blocks
    num_spec = L - 1
    slots = 1 + R * L + spare_slots
    state_len = 3 + num_spec
    dim = cfg.qkv_dim
    conv_shape = (slots, state_len, dim) if conv_layout == "SD" else (slots, dim, state_len)
    perm = torch.randperm(slots - 1, generator=gen)[: R * L] + 1
    idx = perm.view(R, L).to(torch.int32)
    for r in pad:
        idx[r] = pad_slot
    acc = torch.randint(1, L + 1, (R,), generator=gen, dtype=torch.int32)
    acc[list(pad)] = 1
    return LayerInputs(
        cfg=cfg,
        R=R,
        L=L,
        num_blocks=nb,
        write_idx=wi,
        prefix=torch.randn(S, H, generator=gen).to(torch.bfloat16).to(device),
        delta=torch.randn(S, H, generator=gen).to(torch.bfloat16).to(device) if delta else None,
        blocks=torch.randn(S, total_blocks, H, generator=gen).to(torch.bfloat16).to(device),
        weights=weights if weights is not None else make_weights(cfg, device, gen),
        conv_cache=torch.randn(*conv_shape, generator=gen).to(torch.bfloat16).to(device),
        conv_layout=conv_layout,
        state=(
            torch.randn(slots, cfg.local_heads, cfg.kda_head_dim, cfg.kda_head_dim, generator=gen)
            * 0.1
        ).to(device),
        state_indices=(idx if spec else idx[:, 0].contiguous()).to(device),
        num_accepted=acc.to(device) if spec else None,
        out=torch.full((S, cfg.local_proj), float("nan"), dtype=torch.bfloat16, device=device),
    )
