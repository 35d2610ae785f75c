"""K2's contract in pure Python: build keys, the item plan, every wait naming a smaller
ticket, scratch and peer layouts, the launch spec (no kernel runs)."""

from __future__ import annotations

import inspect

import pytest
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2 import triton_build
from mono_kernels_kimi.k2.build import K2Gluon, K2Triton, launch_spec
from mono_kernels_kimi.k2.spec import (
    ALIGN,
    INPUTS,
    MAX_ROWS,
    STAGES,
    K2Build,
    peer_base,
    peer_bytes,
    peer_layout,
    scratch_layout,
    stage_of,
    stages,
    starts,
    table_offsets,
    table_sizes,
    tickets,
    waits,
)
from mono_runtime.kernel import RUNTIME_ARGS, registry
from mono_runtime.timeline import stamp_bytes

pytestmark = pytest.mark.timeout(60)

BUILDS = [K2Build(KimiK3Config.tiny(tp), s) for tp in (1, 2, 4) for s in (1, 3, 16)] + [
    K2Build(KimiK3Config(tp=tp), s) for tp, s in ((1, 1), (2, 16), (4, 4), (8, 1), (8, 16))
]


def _ids(b):
    return f"{'tiny' if b.cfg.hidden_size < 2048 else 'real'}-tp{b.tp}-s{b.rows}"


@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_every_wait_names_a_smaller_ticket(b):
    for nslots in {0, 1, b.max_slots}:
        for t, waited in waits(b, nslots).items():
            assert waited, f"ticket {t} waits for nothing"
            assert max(waited) < t, f"ticket {t} waits for ticket {max(waited)}"


@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_the_plan_covers_every_shape(b):
    c, p = b.cfg, b.plan
    assert [name for name, _ in stages(b)] == list(STAGES)
    assert p.no * p.oc == c.hidden_size and p.nch * p.rc == c.hidden_size
    assert p.nr * 16 >= c.experts_per_rank and p.nl * p.lb >= c.latent_per_rank
    assert p.nsu * p.sb == c.shared_intermediate and p.nsd * p.sd == c.hidden_size
    assert p.nc * p.bn == c.routed_intermediate and p.nd * p.dc == c.latent_size
    assert p.nu * p.uc == c.hidden_per_rank and p.nf * p.fc == c.hidden_size
    assert c.hidden_size % (p.rbk * p.dks) == 0  # split K: whole steps in every part
    for bk, k in ((p.obk, c.o_proj_in), (p.rbk, c.hidden_size), (p.sdk, c.shared_intermediate)):
        assert k % bk == 0 and bk >= 16
    for bk, k in ((p.ubk, c.latent_size), (p.dbk, c.routed_intermediate)):
        assert k % bk == 0 and bk % 32 == 0  # MXFP4 steps whole scale groups
    st = starts(b)
    assert st["oproj"] == 0 and st["handshake"] == tickets(b, False)
    assert tickets(b, True) == tickets(b, False) + 1
    assert dict(stages(b))["up"] == b.max_slots * p.nc * p.uks
    assert (c.latent_size // p.ubk) % p.uks == 0  # split K: whole steps in every part


def test_counts_of_a_tiny_tp2_width_3():
    b = K2Build(KimiK3Config.tiny(2), 3)
    assert b.max_slots == 12  # 3 rows x 4 picks of 16 experts
    assert dict(stages(b)) == dict(
        oproj=2, col=6, mix=6, norm=6, router=2, latdown=2, shup=4, shdown=2, gather=3, route=3,
        union=1, up=48, down=4, dsum=2, lred=3, upproj=2, final=6, handshake=1,
    )  # fmt: skip
    assert (b.plan.uks, b.plan.ubk) == (2, 32)  # the interpreter runs the up split K


@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_layouts_are_aligned_and_disjoint(b):
    for layout in (scratch_layout(b), peer_layout(b.cfg)):
        spans = sorted(layout.values())
        for (off, n), (nxt, _) in zip(spans, spans[1:], strict=False):
            assert off % ALIGN == 0 and off + n <= nxt
    assert min(off for off, _ in peer_layout(b.cfg).values()) >= peer_base(b.tp) >= 8 * b.tp
    assert peer_bytes(b.cfg) >= sum(n for _, n in peer_layout(b.cfg).values())
    assert scratch_layout(b)["done"][1] == 8 * tickets(b, True)
    offs = table_offsets(b)
    assert list(offs.values()) == sorted(offs.values())
    assert scratch_layout(b)["table"][1] == sum(table_sizes(b).values())


def test_peer_regions_start_past_k1s_handshake():
    """K1 and K2 launches of one step share the peer buffer: K2 never writes K1's pairs."""
    from mono_kernels_kimi.kda.triton_build import peer_bytes as k1_peer_bytes

    for tp in (1, 2, 4, 8):
        assert peer_base(tp) >= k1_peer_bytes(tp)


def test_peer_regions_hold_16_rows_for_every_width():
    cfg = KimiK3Config.tiny(2)
    pl = peer_layout(cfg)
    assert pl["ar1"][1] == 2 * MAX_ROWS * 8 * cfg.hidden_size // 2
    assert pl["lg"][1] == MAX_ROWS * 8 * cfg.num_experts


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(rows=0), "rows"),
        (dict(rows=17), "rows"),
        (dict(cfg=KimiK3Config(tp=16)), "tp"),
    ],
)
def test_bad_builds_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        K2Build(**({"cfg": KimiK3Config.tiny(1), "rows": 1} | kw))


def test_tile_overrides_are_checked(monkeypatch):
    """MONO_K2_TILES replaces a real-shape build's K steps, stages and programs an SM (a
    benchmark's variant; the default's bf16 streams at K step 128 fit two programs an
    SM); tiny builds keep theirs; bad values are refused by name."""
    from mono_kernels_kimi.k2.spec import TILES_ENV

    real = KimiK3Config(tp=8)
    assert (K2Build(real, 1).plan.obk, K2Build(real, 1).plan.occ) == (128, 2)
    monkeypatch.setenv(TILES_ENV, "obk=256,sdk=256,occ=1")
    p = K2Build(real, 1).plan
    assert (p.obk, p.sdk, p.occ, p.stages) == (256, 256, 1, 3)
    monkeypatch.setenv(TILES_ENV, "sb=64,uc=64,oc=128,dks=2,bn=128")
    p = K2Build(real, 1).plan
    assert (p.sb, p.nsu, p.uc, p.oc, p.dks, p.bn, p.nc) == (64, 12, 64, 128, 2, 128, 3)
    assert K2Build(KimiK3Config.tiny(1), 1).plan.occ == 1
    monkeypatch.delenv(TILES_ENV)  # the Gluon build's down items ring their slots, and
    # its up items their gate and up rows
    gl, tr = K2Build(real, 1, frag=True).plan, K2Build(real, 1).plan
    assert (gl.dring, gl.ring, tr.dring, tr.ring) == (1, 1, 0, 0)
    # the up items' K in two parts at S = 1 (LAT / ubk = 14 steps), one past, unless asked
    assert (gl.uks, K2Build(real, 2, frag=True).plan.uks) == (2, 1)
    assert dict(stages(K2Build(real, 1, frag=True)))["up"] == 16 * 6 * 2
    monkeypatch.setenv(TILES_ENV, "uks=2")
    assert dict(stages(K2Build(real, 4, frag=True)))["up"] == 64 * 6 * 2
    # the router's own ring depth (0: stages) and prefetch, the down stage's slot groups
    assert (gl.rst, gl.rpf, gl.rres, gl.ng) == (3, 0, 0, 8)
    monkeypatch.setenv(TILES_ENV, "rst=13,rpf=1792,ng=9")
    p = K2Build(real, 16, frag=True).plan
    assert (p.rst, p.rpf, p.ng, dict(stages(K2Build(real, 16, frag=True)))["down"]) == (
        13, 1792, 9, 28 * 9,
    )  # fmt: skip
    monkeypatch.setenv(TILES_ENV, "stages=4")
    assert K2Build(real, 1).plan.rst == 4
    bad_tiles = ("obk=96", "sdk=8", "occ=3", "stages=0", "nope=1", "obk=x", "sb=24", "dks=3")
    more = ("dring=2", "uks=4", "uks=3", "rst=16", "rpf=2048", "rpf=8", "ng=0", "rres=2")
    for bad in bad_tiles + more:
        monkeypatch.setenv(TILES_ENV, bad)
        with pytest.raises(ValueError, match="K2 tiles|MONO_K2_TILES"):
            _ = K2Build(real, 1).plan


def test_build_keys_differ_by_width_tp_and_layout():
    keys = {
        K2Build(KimiK3Config.tiny(tp), s, p).key()
        for tp in (1, 2)
        for s in (1, 2)
        for p in (True, False)
    }
    assert len(keys) == 8


def test_registered_and_the_launch_spec_is_the_kernel_args_keywords():
    assert registry.get("k2 triton") is K2Triton and registry.get("k2 gluon") is K2Gluon
    example = K2Triton.example().key
    assert (example.cfg, example.rows) == (KimiK3Config(tp=8), 4)
    names = list(launch_spec(example).names)
    assert names == list(inspect.signature(triton_build.kernel_args).parameters)[1:]
    assert tuple(names[-len(RUNTIME_ARGS) :]) == tuple(a.name for a in RUNTIME_ARGS)
    assert launch_spec(example).by_name["weights"].layout == "mxfp4-rot"
    assert K2Triton.example().supports("sm90") is None
    assert "not cpu" in K2Triton.example().supports("cpu")
    gluon = K2Gluon.example()
    assert gluon.key.layout == "mxfp4-frag" and gluon.supports("sm90") is None
    assert "no interpreter" in gluon.supports("interpreter")
    assert "one K step" in K2Gluon(K2Build(KimiK3Config.tiny(1), 2, frag=True)).supports("sm90")
    assert "Gluon build" in K2Triton(gluon.key).supports("sm90")
    with pytest.raises(ValueError, match="packed=True"):
        K2Build(KimiK3Config.tiny(1), 2, packed=False, frag=True)


def test_kernel_parameters_are_the_launch_args_then_constexprs():
    params = triton_build.k2_kernel.arg_names
    n = len(triton_build.LAUNCH_ARGS)
    assert tuple(params[:n]) == triton_build.LAUNCH_ARGS
    for b in (BUILDS[0], BUILDS[-1]):
        assert set(params[n:]) == set(triton_build.constexprs(b, cpu=True))


def test_timeline_builds_stamp_every_ticket():
    b = K2Build(KimiK3Config.tiny(2), 3, timeline=True)
    assert scratch_layout(b)["timeline"][1] == stamp_bytes(tickets(b, True))
    assert "timeline" not in scratch_layout(K2Build(KimiK3Config.tiny(2), 3))
    assert [stage_of(b, t) for t in range(tickets(b, True))] == [
        name for name, n in stages(b) for _ in range(n)
    ]


def test_real_shape_mxfp4_tiles_stream_at_speed():
    """Routed up and down items of a TP8 rank stream MXFP4 in tiles of >= MX_FAST_ROWS rows
    at every width (fewer ran 4-10x slower on the H200)."""
    from mono_runtime.stream.layout import MX_FAST_ROWS

    for rows in (1, 2, 4, 8, 16):
        p = K2Build(KimiK3Config(tp=8), rows).plan
        assert p.bn >= MX_FAST_ROWS and p.dc >= MX_FAST_ROWS, (rows, p.bn, p.dc)


def test_stage_inputs_come_earlier_and_cover_the_waits():
    """Every stage but oproj has inputs, each of an earlier stage in ticket order (a chain
    of `critical_path` goes back in time), and every done-pair wait of `waits` is among a
    ticket's inputs (`timeline.stage_deps` over a launch's rows)."""
    from mono_runtime.timeline import stage_deps

    b = K2Build(KimiK3Config.tiny(2), 3)
    order = {name: i for i, name in enumerate(STAGES)}
    assert set(INPUTS) == set(STAGES) - {"oproj"}
    assert all(order[src] < order[name] for name, srcs in INPUTS.items() for src in srcs)
    rows = [dict(ticket=t, stage=stage_of(b, t)) for t in range(tickets(b, True))]
    deps = stage_deps(rows, INPUTS)
    for t, waited in waits(b, b.max_slots).items():
        assert set(waited) <= set(deps[t]), (stage_of(b, t), t)
