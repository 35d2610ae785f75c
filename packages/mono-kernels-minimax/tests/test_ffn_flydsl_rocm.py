"""The FlyDSL build of the FFN monokernel executed on an AMD GPU (marker rocm; skipped with
a reason elsewhere) against the plain-torch reference: TP1 on one GPU (the rank is its own
peer), both weight formats, widths 1..16 with padding rows, each expert subset, two steps
(tags move on, the ticket counter is reset), and a step past the era that gives up."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn import flydsl_build as fb
from mono_kernels_minimax.ffn.reference import ffn_reference
from mono_kernels_minimax.ffn.spec import Experts, FfnBuild, peer_bytes, scratch_bytes
from mono_kernels_minimax.ffn.weights import random_weights
from mono_kernels_minimax.formats import WeightFormat
from mono_runtime import protocol as proto

pytestmark = pytest.mark.rocm

TINY, REAL = MiniMaxM3Config.tiny(), MiniMaxM3Config()
MX, BF = WeightFormat.MXFP4, WeightFormat.BF16


class Rank:
    """One TP1 rank's device state laid out as mono_runtime's PROTOCOL.md says."""

    def __init__(self, b: FfnBuild, dev: torch.device):
        self.ctl = torch.zeros(proto.CTL_WORDS, dtype=torch.int64, device=dev)
        self.ctl[proto.CTL_DEADLINE] = 2_000_000_000  # 2 s
        self.health = torch.zeros(proto.HEALTH_WORDS, dtype=torch.int64, device=dev)
        self.tickets = torch.zeros(proto.SLOTS, dtype=torch.int64, device=dev)
        self.scratch = torch.zeros(scratch_bytes(b), dtype=torch.uint8, device=dev)
        self.peer = torch.zeros(
            proto.PEER_HEAD + peer_bytes(b.cfg, b.tp), dtype=torch.uint8, device=dev
        )
        self.peers = torch.tensor([self.peer.data_ptr()], dtype=torch.int64, device=dev)

    def run(self, b, w, part, residual, slots, programs, final=False):
        out = torch.empty_like(part)
        residual_out = torch.empty_like(residual)
        fb.launch(
            b,
            programs,
            part=part.view(torch.int32),
            residual=residual.view(torch.int32),
            out=out.view(torch.int32),
            residual_out=residual_out.view(torch.int32),
            slots=slots,
            weights=w,
            scratch=self.scratch,
            slot=0,
            final=int(final),
            ctl=self.ctl,
            health=self.health,
            tickets=self.tickets,
            peers=self.peers,
            rank=0,
            world=1,
        )
        torch.cuda.synchronize()
        return out, residual_out


def _inputs(cfg, rows, pad, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    part = torch.randn(rows, cfg.hidden_size, generator=g, device=dev).to(torch.bfloat16)
    residual = torch.randn(rows, cfg.hidden_size, generator=g, device=dev).to(torch.bfloat16)
    slots = torch.arange(rows, dtype=torch.int64, device=dev)
    if pad:
        slots[-pad:] = -1
    return part, residual, slots


def _check(cfg, out, residual_out, ref, slots):
    assert torch.equal(residual_out, ref.residual) or torch.allclose(
        residual_out.float(), ref.residual.float(), rtol=1e-2, atol=1e-2
    )
    live = slots >= 0
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))
    a, r = out[live].float(), ref.out[live].float()
    assert torch.isfinite(a).all()
    err = (a - r).norm() / r.norm().clamp_min(1e-6)
    assert err < 2e-2, f"relative error {err:.3g}"


CASES = [
    (TINY, 1, MX, Experts.ALL, 0),
    (TINY, 3, BF, Experts.ALL, 1),
    (TINY, 16, MX, Experts.ALL, 3),
    (TINY, 5, MX, Experts.ROUTED, 0),
    (TINY, 5, MX, Experts.SHARED, 0),
    (REAL, 1, MX, Experts.ALL, 0),
    (REAL, 16, MX, Experts.ALL, 2),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "cfg,rows,fmt,experts,pad",
    CASES,
    ids=[
        f"{'tiny' if c is TINY else 'real'}-s{s}-{f.value}-{e.value}-pad{p}"
        for c, s, f, e, p in CASES
    ],
)
def test_matches_the_reference_over_two_steps(cfg, rows, fmt, experts, pad):
    dev = torch.device("cuda")
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    b = FfnBuild(cfg, rows, 1, fmt, experts)
    w = random_weights(cfg, 1, fmt, seed=1, device=dev)
    rank = Rank(b, dev)
    for step in (1, 2):
        rank.ctl[proto.CTL_EPOCH] = step
        part, residual, slots = _inputs(cfg, rows, pad, dev, seed=step)
        out, residual_out = rank.run(b, w, part, residual, slots, programs, final=step == 2)
        assert int(rank.health[proto.H_GIVEUPS]) == 0, rank.health[:16].tolist()
        assert int(rank.tickets[0]) == 0  # the last taker reset the counter
        ref = ffn_reference(cfg, [part], residual, [w], slots, experts)
        _check(cfg, out, residual_out, ref, slots)


@pytest.mark.timeout(120)
def test_a_step_past_the_era_gives_up_and_poisons():
    dev = torch.device("cuda")
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    b = FfnBuild(TINY, 2, 1, MX)
    w = random_weights(TINY, 1, MX, seed=1, device=dev)
    rank = Rank(b, dev)
    rank.ctl[proto.CTL_EPOCH] = proto.ERA_STEPS + 1
    part, residual, slots = _inputs(TINY, 2, 0, dev, seed=3)
    out, _ = rank.run(b, w, part, residual, slots, programs)
    assert int(rank.health[proto.H_GIVEUPS]) > 0
    assert int(rank.health[proto.HEALTH_HEAD + proto.R_KIND]) == proto.KIND_ERA
    assert int(rank.peer[:4].view(torch.int32)) == proto.ALARM_GAVE_UP
    assert torch.isnan(out.float()).all()
