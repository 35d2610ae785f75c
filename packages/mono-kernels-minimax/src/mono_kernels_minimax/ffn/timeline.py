"""The per-item timeline of a `timeline=True` FFN build: which program ran which item
when, per stage, and a picture of items over programs.

A timeline build stamps the device clock (ns) at each ticket's start and end into its
scratch (`spec.scratch_layout`'s `timeline`); `FfnRunner.timeline(s)` reads width s's last
launch. Stages come from the ticket order of `spec.TaskPlan` and the launch's slot count.
"""

from __future__ import annotations

import torch

from .spec import FfnBuild, stages


def stage_bounds(b: FfnBuild, nslots: int, final: bool) -> list[tuple[str, int, int]]:
    """(stage, first ticket, end ticket) of a launch of `b` that routed `nslots` slots."""
    out, t = [], 0
    for name, n in stages(b, nslots, final):
        out.append((name, t, t + n))
        t += n
    return out


def items(stamps: torch.Tensor, b: FfnBuild, nslots: int, final: bool) -> list[dict]:
    """One dict per item of the launch (program, ticket, stage, start and end in us from
    the launch's first stamp), from the raw int64 [tickets, 4] stamps."""
    bounds = stage_bounds(b, nslots, final)
    total = bounds[-1][2]
    rows = stamps[:total].cpu().tolist()
    t0 = min(r[2] for r in rows)
    out = []
    for prog, ticket, start, end in rows:
        stage = next(name for name, lo, hi in bounds if lo <= ticket < hi)
        out.append(
            dict(
                program=prog,
                ticket=ticket,
                stage=stage,
                start_us=(start - t0) / 1e3,
                end_us=(end - t0) / 1e3,
            )
        )
    return out


def summary(rows: list[dict]) -> str:
    """Per stage: items, first start and last end (us from the launch's first stamp), and
    the mean item time; then the launch's span."""
    lines = [f"{'stage':10s} {'items':>5s} {'first us':>9s} {'last us':>8s} {'mean us':>8s}"]
    for name in dict.fromkeys(r["stage"] for r in rows):  # ticket order
        got = [r for r in rows if r["stage"] == name]
        first = min(r["start_us"] for r in got)
        last = max(r["end_us"] for r in got)
        mean = sum(r["end_us"] - r["start_us"] for r in got) / len(got)
        lines.append(f"{name:10s} {len(got):5d} {first:9.1f} {last:8.1f} {mean:8.2f}")
    lines.append(
        f"span {max(r['end_us'] for r in rows):.1f} us over "
        f"{len({r['program'] for r in rows})} programs"
    )
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str = "") -> None:
    """Items as bars over programs (x: us from the launch's first stamp), one colour a stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["stage"] for r in rows))  # ticket order
    colours = dict(zip(names, plt.get_cmap("tab10").colors, strict=False))
    fig, ax = plt.subplots(figsize=(12, 6))
    for name in names:
        got = [r for r in rows if r["stage"] == name]
        if got:
            ax.barh(
                [r["program"] for r in got],
                [r["end_us"] - r["start_us"] for r in got],
                left=[r["start_us"] for r in got],
                height=0.9,
                color=colours[name],
                label=name,
            )
    ax.set_xlabel("us from the launch's first item")
    ax.set_ylabel("program")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
