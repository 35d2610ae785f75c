"""The figures of one `mono bench` run and their three views: a table, JSON and (plot.py) a PNG.

Every time is per call, in microseconds, under graph replay. The memory limit of a point is
the bytes that call must move over the copy bandwidth measured in the same run; a baseline's
"% limit" is measured against the same bytes (the least the point's job can move).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Point:
    rows: int
    kernel_us: float
    baselines_us: dict[str, float]  # op-by-op path(s), by name; the first is the main one
    bytes_moved: int  # bytes one call must read and write at least
    case: tuple[str, ...] = ()  # what else tells points apart (BenchResult.case_names)

    def floor_us(self, copy_gbps: float) -> float:
        return self.bytes_moved / (copy_gbps * 1e3)  # GB/s -> bytes per us

    def pct_of_limit(self, us: float, copy_gbps: float) -> float:
        return 100.0 * self.floor_us(copy_gbps) / us if us > 0 else 0.0

    def gbps(self, us: float) -> float:
        """The bytes the call must move over its time `us`: its effective bandwidth."""
        return self.bytes_moved / (us * 1e3) if us > 0 else 0.0


@dataclass
class BenchResult:
    kernel: str  # ffn | kda | allreduce | gemv
    kernel_label: str  # what the kernel line is called (e.g. "mono FFN (triton)")
    device: str
    copy_gbps: float  # measured device-to-device copy bandwidth, bytes read + written
    points: list[Point] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # format, ranks, shapes: what was measured
    case_names: tuple[str, ...] = ()  # the columns of Point.case (gemv: shape, format)

    @property
    def baseline_names(self) -> list[str]:
        names: list[str] = []
        for point in self.points:
            names += [n for n in point.baselines_us if n not in names]
        return names

    def table(self) -> tuple[list[str], list[list[str]]]:
        names = self.baseline_names
        headers = [*self.case_names, "rows", "kernel us", *[f"{n} us" for n in names]]
        # the first baseline's speedup and % of the limit, then any other baseline's (the
        # FFN's stock path beside its op-by-op one)
        headers += ["speedup", *[f"speedup vs {n}" for n in names[1:]]]
        headers += ["floor us", "kernel GB/s", "kernel % limit"]
        headers += [f"{n} % limit" for n in names]
        rows = []
        for p in self.points:
            cells = [*p.case, str(p.rows), f"{p.kernel_us:.1f}"]
            cells += [f"{p.baselines_us[n]:.1f}" if n in p.baselines_us else "-" for n in names]
            cells += [
                f"{p.baselines_us[n] / p.kernel_us:.2f}x" if p.baselines_us.get(n) else "-"
                for n in names
            ]
            cells.append(f"{p.floor_us(self.copy_gbps):.1f}")
            cells.append(f"{p.gbps(p.kernel_us):.0f}")
            cells.append(f"{p.pct_of_limit(p.kernel_us, self.copy_gbps):.0f}%")
            cells += [
                f"{p.pct_of_limit(p.baselines_us[n], self.copy_gbps):.0f}%"
                if p.baselines_us.get(n)
                else "-"
                for n in names
            ]
            rows.append(cells)
        return headers, rows

    def as_dict(self) -> dict:
        data = asdict(self)
        for point, raw in zip(self.points, data["points"], strict=True):
            raw["floor_us"] = point.floor_us(self.copy_gbps)
            raw["kernel_gbps"] = point.gbps(point.kernel_us)
            raw["kernel_pct_of_limit"] = point.pct_of_limit(point.kernel_us, self.copy_gbps)
            raw["baselines_pct_of_limit"] = {
                n: point.pct_of_limit(us, self.copy_gbps) for n, us in point.baselines_us.items()
            }
        return {"command": "bench", **data}


def rotation(rows: list[dict]) -> dict:
    """Settings from a kernel package's bench rows: how many layers' weights a timed graph
    rotates over, and the least of its reads over the L2 size (under ~4 the cache flatters
    the kernel); empty for rows without them."""
    if not rows or rows[0].get("layers") is None:
        return {}
    l2 = [r["l2_x"] for r in rows if r.get("l2_x") is not None]
    return {
        "layers a timed graph": rows[0]["layers"],
        **({"graph reads / L2 (least)": round(min(l2), 1)} if l2 else {}),
    }


def _baselines(row: dict, baseline: str) -> dict:
    """{label: us} of a bench row: every baseline it timed (`baselines_us`, the FFN's op-by-op
    and stock paths), else its op-by-op path under `baseline`."""
    if row.get("baselines_us") is not None:
        return {k: float(v) for k, v in row["baselines_us"].items()}
    return {} if row["opbyop_us"] is None else {baseline: float(row["opbyop_us"])}


def of_layer_rows(
    kernel: str,
    label: str,
    device: str,
    rows: list[dict],
    baseline: str,
    settings: dict,
    case: tuple[str, ...] = (),
) -> BenchResult:
    """A layer kernel's result from its package's bench rows (rows, kernel_us, opbyop_us,
    bytes, copy_tbps, note): the points, and the settings with the layer rotation and the
    op-by-op path's failures. `case`: the row keys that tell points of equal rows apart
    (the drafter's context, the FFN's format and build), the result's case columns."""

    def where(r: dict) -> str:
        return " ".join([f"rows {r['rows']}", *(f"{k} {r[k]}" for k in case)])

    notes = {where(r): r["note"] for r in rows if r.get("note")}
    return BenchResult(
        kernel=kernel,
        kernel_label=label,
        device=device,
        copy_gbps=float(rows[0]["copy_tbps"]) * 1e3,
        points=[
            Point(
                rows=r["rows"],
                kernel_us=float(r["kernel_us"]),
                baselines_us=_baselines(r, baseline),
                bytes_moved=int(r["bytes"]),
                case=tuple(str(r[k]) for k in case),
            )
            for r in rows
        ],
        settings={
            **settings,
            **rotation(rows),
            **({"baseline failures": notes} if notes else {}),
        },
        case_names=case,
    )
