"""The planner's predicates, one case each (pure Python)."""

from __future__ import annotations

import pytest
from mono_runtime import GraphMode, MonoUnsupported, StepMeta, agree, plan, step_reason


def decode(n: int, **kw) -> StepMeta:
    return StepMeta(n, (1,) * n, 0, n, 0, kv_bound=True, **kw)


def verify(n: int, q: int, **kw) -> StepMeta:
    return StepMeta(n, (q,) * n, 0, 0, n, kv_bound=True, **kw)


def test_pure_decode_and_verify_pass():
    assert step_reason(decode(4), 4, 1) is None
    assert step_reason(verify(2, 4), 8, 4) is None
    assert step_reason(verify(2, 4, graph_mode=GraphMode.FULL), 8, 4) is None


@pytest.mark.parametrize(
    "meta, width, q, why",
    [
        (decode(2, has_intermediate_input=True), 2, 1, "pipeline"),
        (decode(2, is_first_stage=False), 2, 1, "pipeline"),
        (StepMeta(2, (1, 1), 0, 2, 0, kv_bound=False), 2, 1, "no KV cache"),
        (decode(2, graph_mode=GraphMode.PIECEWISE), 2, 1, "PIECEWISE"),
        (StepMeta(0, (), 0, 0, 0, kv_bound=True), 1, 1, "no requests"),
        (StepMeta(2, (5, 1), 1, 1, 0, kv_bound=True), 6, 1, "prefill"),
        (verify(2, 1), 2, 1, "spec-verify request"),
        (StepMeta(2, (4, 1), 0, 1, 1, kv_bound=True), 5, 4, "plain decode"),
        (StepMeta(2, (4, 3), 0, 0, 2, kv_bound=True), 7, 4, "not uniformly 4"),
        (decode(3), 4, 1, "3 rows, kernel width 4"),
    ],
)
def test_each_refusal(meta, width, q, why):
    reason = step_reason(meta, width, q)
    assert reason is not None and why in reason, reason


def test_dtypes():
    meta = decode(1, dtypes={"hidden": "bfloat16"})
    assert step_reason(meta, 1, 1, {"hidden": "bfloat16"}) is None
    assert "float16" in step_reason(meta, 1, 1, {"hidden": "float16"})
    assert "positions is unknown" in step_reason(meta, 1, 1, {"positions": "int64"})


def test_bad_meta_raises():
    with pytest.raises(ValueError, match="query_lens"):
        StepMeta(2, (1,), 0, 2, 0, kv_bound=True)
    with pytest.raises(ValueError, match="requests"):
        StepMeta(2, (1, 1), 0, 1, 0, kv_bound=True)
    with pytest.raises(ValueError, match="GraphMode"):
        StepMeta(1, (1,), 0, 1, 0, kv_bound=True, graph_mode="full")
    with pytest.raises(ValueError, match=">= 1"):
        step_reason(decode(1), 0, 1)


def test_plan_picks_width_and_layers():
    k = {1: {0: "k1-layer0", 3: "k1-layer3"}, 2: {0: "k2-layer0"}}
    step = plan(decode(1), k, 1)
    assert step is not None and step.width == 1
    assert step.layer(3) == "k1-layer3" and step.layer(1) is None
    assert plan(decode(2), k, 1).layer(0) == "k2-layer0"
    assert plan(decode(3), k, 1) is None  # no kernel of that width
    assert plan(decode(2, graph_mode=GraphMode.PIECEWISE), k, 1) is None
    assert plan(decode(1, dtypes={"hidden": "float32"}), k, 1, {"hidden": "bfloat16"}) is None


def test_agree_single_rank():
    agree([], None, "this step")
    with pytest.raises(MonoUnsupported, match="does not support the weights: bad scale"):
        agree(["bad scale"], None, "the weights")
