"""The drafter kernel's Triton build on an NVIDIA GPU (`-m gpu`): the CPU interpreter
tests' cases at TP 1, compiled for the device (a narrow launch, a wide one with a padding
request and a context over many KV blocks; the fp8 cache), and a TP8 rank's full shapes
eager and from a CUDA graph, against drafter_reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drafter_ranks as ranks  # noqa: E402
import test_drafter_triton_cpu as cpu_tests  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_tp1_narrow_and_wide(cache_dtype):
    cases = [cpu_tests.NARROW_ONE, cpu_tests.WIDE_LONG]
    cpu_tests._check(ranks.check_steps(0, 1, None, cases, 0, cache_dtype, device="cuda"))


@pytest.mark.timeout(900)
def test_full_rank_shapes_eager_and_graph():
    """A TP8 rank's Kimi-K3 drafter (hidden 7168, 8 heads, 2304 intermediate columns, 7
    query tokens, 1500 cached tokens a request over shuffled 64-token blocks), narrow (2
    requests) and wide (6): eager and replayed from a CUDA graph, against the reference."""
    for m in ranks.full_rank_eager_and_graph():
        assert m["eager"] < 1e-2 and m["eager_cache"] < 1e-2, m
        assert m["replay_same"], m  # a replay of the same step is the eager launch, bit for bit
        assert m["graph"] < 1e-2 and m["graph_cache"] < 1e-2, m
