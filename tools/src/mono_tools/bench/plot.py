"""The PNG of a bench run: time per call and % of the memory limit against the row count,
the kernel against each op-by-op path. Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path

from mono_tools.bench.results import BenchResult


def save(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [p.rows for p in result.points]
    fig, (ax_time, ax_pct) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [(result.kernel_label, [p.kernel_us for p in result.points])]
    for name in result.baseline_names:
        series.append((name, [p.baselines_us.get(name, float("nan")) for p in result.points]))
    for label, values in series:
        ax_time.plot(rows, values, marker="o", label=label)
        pairs = zip(result.points, values, strict=True)
        pct = [p.pct_of_limit(v, result.copy_gbps) for p, v in pairs]
        ax_pct.plot(rows, pct, marker="o", label=label)
    ax_time.plot(
        rows,
        [p.floor_us(result.copy_gbps) for p in result.points],
        linestyle="--",
        color="gray",
        label=f"memory limit ({result.copy_gbps:.0f} GB/s copy)",
    )
    ax_time.set(xlabel="rows (tokens per step)", ylabel="us per call (graph replay)")
    ax_time.set_ylim(bottom=0)
    ax_pct.set(xlabel="rows (tokens per step)", ylabel="% of memory limit")
    ax_pct.set_ylim(0, 105)
    for ax in (ax_time, ax_pct):
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [str(r) for r in rows])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"mono bench {result.kernel} on {result.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
