"""Bad input raises ValueError naming the argument, before any launch; build keys and
the scratch layout hold what the kernel assumes."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.checks import check_args
from mono_kernels_kimi.kda.inputs import make_inputs
from mono_kernels_kimi.kda.spec import MAX_ROWS, K1Build

CFG = KimiK3Config.tiny()


def good(R=2, L=3, spec=True, layer=4):
    inp = make_inputs(CFG, R, L, spec=spec, layer_idx=layer)
    build = K1Build.for_step(
        CFG,
        R,
        L,
        spec=spec,
        delta=True,
        write_block=inp.write_idx >= 0,
        block_h=32,
        block_n=16,
        block_k=32,
        block_v=8,
    )
    args = dict(
        inp.k1_kwargs(),
        weights=dict(inp.weights),
        scratch=torch.zeros(build.scratch_bytes, dtype=torch.uint8),
    )
    return build, args


def test_good_inputs_pass():
    for spec, L in ((True, 3), (False, 1)):
        build, args = good(L=L, spec=spec)
        check_args(build, **args)


def _weights(args, **kw):
    return {**args["weights"], **kw}


BAD = {
    "prefix-dtype": ("prefix", lambda a: {"prefix": a["prefix"].float()}),
    "prefix-strides": ("prefix", lambda a: {"prefix": a["prefix"].t().contiguous().t()}),
    "delta-shape": ("delta", lambda a: {"delta": a["delta"][:1]}),
    "blocks-shape": ("blocks", lambda a: {"blocks": a["blocks"][:, :, :8]}),
    "num_blocks-range": ("num_blocks", lambda a: {"num_blocks": a["blocks"].shape[1] + 1}),
    "write_idx-reads-written-block": ("write_idx", lambda a: {"write_idx": a["num_blocks"] - 1}),
    "in_proj-shape": (
        "in_proj",
        lambda a: {"weights": _weights(a, in_proj=a["weights"]["in_proj"][:-16])},
    ),
    "conv-dtype": (
        "conv",
        lambda a: {"weights": _weights(a, conv=a["weights"]["conv"].bfloat16())},
    ),
    "a_log-device": (
        "a_log",
        lambda a: {"weights": _weights(a, a_log=torch.empty(2, device="meta"))},
    ),
    "f_b-missing": (
        "f_b",
        lambda a: {"weights": {k: v for k, v in a["weights"].items() if k != "f_b"}},
    ),
    "conv_state-dim": ("conv_state", lambda a: {"conv_state": a["conv_state"][:, :-1]}),
    "conv_state-short": ("conv_state", lambda a: {"conv_state": a["conv_state"][:, :, :3]}),
    "state-dtype": ("state", lambda a: {"state": a["state"].bfloat16()}),
    "state-strides": ("state", lambda a: {"state": a["state"].transpose(2, 3)}),
    "state-slots": ("state", lambda a: {"state": a["state"][:-1]}),
    "state_indices-dtype": (
        "state_indices",
        lambda a: {"state_indices": a["state_indices"].long()},
    ),
    "state_indices-too-big": (
        "state_indices",
        lambda a: {"state_indices": torch.full_like(a["state_indices"], a["state"].shape[0])},
    ),
    "state_indices-too-small": (
        "state_indices",
        lambda a: {"state_indices": torch.full_like(a["state_indices"], -2)},
    ),
    "num_accepted-missing": ("num_accepted", lambda a: {"num_accepted": None}),
    "num_accepted-zero": (
        "num_accepted",
        lambda a: {"num_accepted": torch.zeros_like(a["num_accepted"])},
    ),
    "num_accepted-past-L": ("num_accepted", lambda a: {"num_accepted": a["num_accepted"] + 3}),
    "out-dtype": ("out", lambda a: {"out": a["out"].float()}),
    "scratch-small": ("scratch", lambda a: {"scratch": a["scratch"][:64]}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_argument(case):
    name, change = BAD[case]
    build, args = good()
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    changed = change(args)
    args.update(changed)
    with pytest.raises(ValueError, match=f"`{name}`"):
        check_args(build, **args)
    for k, v in before.items():  # raised before touching anything
        if k not in changed:
            torch.testing.assert_close(args[k], v, rtol=0, atol=0, equal_nan=True)


def test_plain_decode_refuses_num_accepted():
    build, args = good(L=1, spec=False)
    args["num_accepted"] = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="`num_accepted`"):
        check_args(build, **args)


def test_more_than_sixteen_rows_refused():
    with pytest.raises(ValueError, match="rows"):
        K1Build.for_step(CFG, 3, 6)
    from mono_kernels_kimi.kda.runner import KdaRunner

    runner = KdaRunner(CFG, "cpu", 3)
    assert runner.widths == (1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="requests"):
        runner.build(6, True, False)
    with pytest.raises(ValueError, match="max_rows"):
        KdaRunner(CFG, "cpu", 17)


@pytest.mark.parametrize(
    "R,L", [(R, L) for L in range(1, MAX_ROWS + 1) for R in range(1, MAX_ROWS // L + 1)]
)
def test_scratch_regions_disjoint_and_items_cover_the_work(R, L):
    cfg = KimiK3Config()
    b = K1Build.for_step(cfg, R, L)
    regions = sorted(b.scratch_layout().values())
    for (o1, n1), (o2, _) in zip(regions, regions[1:], strict=False):
        assert o1 + n1 <= o2 and o2 % 256 == 0
    ares, mix, proj, head = b.stage_items
    assert ares == mix == R * L * 7168 // b.block_h  # (row, block_h columns of 7168)
    assert ares <= 132 or b.block_h == 1024  # one wave of AttnRes items (spec.ares_block_h)
    parts = 2 if R * L in (1, 2, 8) else 4  # spec.proj_split_k
    assert proj == 50 * parts and b.split_k == parts  # 50 blocks of 128 rows x K parts
    assert b.shared_blocks * 128 >= cfg.in_proj_rows - 4 * 1536 > (b.shared_blocks - 1) * 128
    nvc = 128 // b.block_v  # a (head, request): its kda items, then its norm if apart
    assert head == R * 12 * (nvc + (nvc > 1))
    assert b.scratch_bytes >= regions[-1][0] + regions[-1][1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"programs": 0}, "programs must be >= 1"),
        ({"programs": -3}, "programs must be >= 1"),
        ({"programs": 1.5}, "programs must be an int"),
        ({"block_v": True}, "block_v must be an int"),
        ({"grid": 4}, "unknown tiling keyword 'grid'"),
        ({"L": 1.0}, "L must be an int"),
        ({"max_rows": 2.0}, "max_rows must be an int"),
        ({"block_n": 32}, r"block_n = 32 must be <= min\(head_dim, 128\)"),
        ({"split_k": 4}, "hidden = 64 must be a multiple of split_k x block_k"),
    ],
)
def test_runner_refuses_bad_widths_and_tiling_before_allocating(kwargs, match):
    from mono_kernels_kimi.kda.runner import KdaRunner

    L = kwargs.pop("L", 1)
    with pytest.raises(ValueError, match=match):
        KdaRunner(CFG, "cpu", L, **kwargs)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"num_blocks": 1.5}, "`num_blocks` must be an int"),
        ({"num_blocks": torch.tensor(1)}, "`num_blocks` must be an int"),
        ({"write_idx": 2.0}, "`write_idx` must be an int"),
        ({"requests": 1.5}, "requests must be an int"),
    ],
)
def test_runner_refuses_a_launch_scalar_that_is_not_an_int_and_writes_nothing(change, match):
    from mono_kernels_kimi.kda.runner import KdaRunner

    inp = make_inputs(CFG, 1, 1, spec=False, layer_idx=4)
    runner = KdaRunner(CFG, "cpu", 1, spec=False, max_rows=1)
    kwargs = inp.k1_kwargs()
    requests = change.pop("requests", 1)
    before = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=match):
        runner(requests, **{**kwargs, **change})
    assert not runner.scratch.any()
    for name, tensor in before.items():
        torch.testing.assert_close(
            kwargs[name], tensor, rtol=0, atol=0, equal_nan=True, msg=f"{name} was written"
        )
