"""mono_runtime.timing: bad arguments fail before any device work (CPU); on a GPU the
copy rate and a graph-replayed call's time are sane."""

from __future__ import annotations

import pytest
import torch
from mono_runtime.timing import copy_bandwidth, graph_time


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(reps=0), "reps: expected an integer >= 1, got 0"),
        (dict(warmup=0), "warmup: expected an integer >= 1"),
        (dict(calls=2.5), "calls: expected an integer >= 1, got 2.5"),
        (dict(reps=True), "reps: expected an integer"),
    ],
)
def test_graph_time_refuses_bad_counts(kwargs, says):
    with pytest.raises(ValueError, match=says):
        graph_time(lambda: None, **kwargs)


def test_graph_time_refuses_a_non_callable():
    with pytest.raises(ValueError, match="fn: expected a callable, got int"):
        graph_time(3)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(nbytes=0), "nbytes: expected an integer >= 1, got 0"),
        (dict(iters=-1), "iters: expected an integer >= 1"),
        (dict(device="cpu"), "device: cpu is not a GPU"),
    ],
)
def test_copy_bandwidth_refuses_bad_arguments(kwargs, says):
    with pytest.raises(ValueError, match=says):
        copy_bandwidth(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_without_a_gpu_the_error_says_so():
    with pytest.raises(RuntimeError, match="copy_bandwidth needs a GPU"):
        copy_bandwidth()
    with pytest.raises(RuntimeError, match="graph_time needs a GPU"):
        graph_time(lambda: None)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_on_a_gpu():
    rate = copy_bandwidth(nbytes=1 << 28, iters=5)
    assert 1e11 < rate < 1e14, rate  # 100 GB/s .. 100 TB/s
    x = torch.zeros(1 << 20, device="cuda")
    per_call = graph_time(lambda: x.add_(1), reps=5, warmup=1, calls=10)
    assert 0 < per_call < 1e-3
    torch.cuda.synchronize()
    assert x[0].item() == 1 + 10 * (1 + 5)  # one eager warmup; capture runs nothing; replays


def test_timeline_show_writes_the_rows_beside_the_picture(tmp_path, capsys):
    """The per-stage table is printed, the rows land as JSON next to the picture (written
    first: kept even where matplotlib is missing), and the picture is drawn."""
    import json

    from mono_runtime.timeline import show

    rows = [
        dict(program=0, stage="up", start_us=0.0, ready_us=0.0, end_us=2.0),
        dict(program=1, stage="down", start_us=1.0, ready_us=2.0, end_us=4.5),
    ]
    path = tmp_path / "pics" / "timeline-x.png"
    try:
        show(rows, "a launch", path, "x")
    except RuntimeError as err:  # no matplotlib in this environment: the rows are still there
        assert "matplotlib" in str(err)
    else:
        assert path.stat().st_size > 0
    assert json.loads(path.with_suffix(".json").read_text()) == rows
    out = capsys.readouterr().out
    assert "-- a launch" in out and "down" in out
