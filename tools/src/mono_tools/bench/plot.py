"""The PNG of a bench run: time per call and % of the memory limit against the row count,
the kernel against each op-by-op path. Agg backend: no display needed.

Points with a case (gemv: shape, format) get a row of panels per case less its last part
(a shape) and a kernel line, with its own memory limit, per last part (a format); a
baseline shared by a panel's cases is drawn once, from the first case that has it."""

from __future__ import annotations

from pathlib import Path

from mono_tools.bench.results import BenchResult, Point

Line = list[tuple[int, float, Point]]  # (rows, us, the point the us belongs to)


def _panels(result: BenchResult) -> dict[tuple[str, ...], list[Point]]:
    panels: dict[tuple[str, ...], list[Point]] = {}
    for point in result.points:
        panels.setdefault(point.case[:-1], []).append(point)
    return panels


def _suffix(point: Point) -> str:
    return f" {point.case[-1]}" if point.case else ""


def _kernel_lines(result: BenchResult, points: list[Point]) -> dict[str, Line]:
    lines: dict[str, Line] = {}
    for p in points:
        label = f"{result.kernel_label}{_suffix(p)}"
        lines.setdefault(label, []).append((p.rows, p.kernel_us, p))
    return lines


def _baseline_lines(result: BenchResult, points: list[Point]) -> dict[str, Line]:
    lines: dict[str, Line] = {}
    for name in result.baseline_names:
        seen: dict[int, tuple[int, float, Point]] = {}
        for p in points:
            if name in p.baselines_us and p.rows not in seen:
                seen[p.rows] = (p.rows, p.baselines_us[name], p)
        if seen:
            lines[name] = sorted(seen.values(), key=lambda t: t[0])
    return lines


def save(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy = result.copy_gbps
    panels = _panels(result)
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for (case, points), (ax_time, ax_pct) in zip(panels.items(), axes, strict=True):
        kernels = _kernel_lines(result, points)
        for label, line in {**kernels, **_baseline_lines(result, points)}.items():
            rows = [r for r, _, _ in line]
            (drawn,) = ax_time.plot(rows, [us for _, us, _ in line], marker="o", label=label)
            pct = [p.pct_of_limit(us, copy) for _, us, p in line]
            ax_pct.plot(rows, pct, marker="o", color=drawn.get_color(), label=label)
            if label in kernels:
                ax_time.plot(
                    rows,
                    [p.floor_us(copy) for _, _, p in line],
                    linestyle="--",
                    color=drawn.get_color(),
                    label=f"memory limit{_suffix(line[0][2])} ({copy:.0f} GB/s copy)",
                )
        rows = sorted({p.rows for p in points})
        title = ", ".join(f"{n} {v}" for n, v in zip(result.case_names, case, strict=False))
        ax_time.set(xlabel="rows (tokens per step)", ylabel="us per call (graph replay)")
        ax_time.set_ylim(bottom=0)
        ax_pct.set(xlabel="rows (tokens per step)", ylabel="% of memory limit")
        ax_pct.set_ylim(0, 105)
        for ax in (ax_time, ax_pct):
            ax.set_xscale("log", base=2)
            ax.set_xticks(rows, [str(r) for r in rows])
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            if title:
                ax.set_title(title, fontsize=9)
    fig.suptitle(f"mono bench {result.kernel} on {result.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
