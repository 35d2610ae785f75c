"""A kernel's per-item timeline, read back from a timeline build (each ticket's program,
start, ready, end and mark stamped by the device clock): a per-stage table and a picture of
items over programs, the same for every kernel, so their timelines read alike.

Rows are dicts with program, sm (the multiprocessor it ran on: programs that share one
share its memory pipeline), stage, start_us, ready_us and end_us (us from the launch's
first stamp), in ticket order; each kernel maps its tickets to stages (`from_stamps`).
`ready` is when the item's (first) done-pair wait returned, so a stage's time splits into
waiting for its inputs and its own work; inputs that come by peer polls, and the waits of
an item that waits again between its streams (K2's and the FFN's down items, slot by
slot), count as work. A stage may also stamp a `mark` inside an item's work (`mark_us`;
None where it stamps none), which splits the work in two: e.g. K2's dsum items mark when
their partials are in, so loads and push read apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

STAMP_WORDS = 6  # int64 words a ticket stamps: program + 2^32 SM, ticket, start, ready, end, mark
NO_MARK = -1  # the mark word of an item whose stage stamps none


def stamp_bytes(tickets: int) -> int:
    """Scratch bytes of a timeline build's stamps (`STAMP_WORDS` int64 a ticket)."""
    return 8 * STAMP_WORDS * tickets


def read_stamps(region: torch.Tensor, tickets: int) -> list[list[int]]:
    """The first `tickets` raw stamps of a timeline build's scratch region (its bytes), each
    (program, ticket, start, ready, end, mark), for `from_stamps`."""
    return region.view(torch.int64).view(-1, STAMP_WORDS)[:tickets].cpu().tolist()


def from_stamps(stamps: Sequence[Sequence[int]], stage_of: Callable[[int], str]) -> list[dict]:
    """Rows from raw (program + 2^32 SM, ticket, start, ready, end, mark) ns stamps; times
    from the first start."""
    t0 = min(r[2] for r in stamps)
    return [
        dict(
            program=prog & 0xFFFFFFFF,
            sm=prog >> 32,
            ticket=ticket,
            stage=stage_of(ticket),
            start_us=(start - t0) / 1e3,
            ready_us=(ready - t0) / 1e3,
            end_us=(end - t0) / 1e3,
            mark_us=None if mark == NO_MARK else (mark - t0) / 1e3,
        )
        for prog, ticket, start, ready, end, mark in stamps
    ]


def summary(rows: list[dict]) -> str:
    """Per stage: items, first start and last end (us from the launch's first stamp), the
    mean item time and its split into waiting for inputs and work, the last item's ready
    time, and the mean work before the stage's mark (ready to mark; "-": no mark); then the
    launch's span."""
    lines = [
        f"{'stage':10s} {'items':>5s} {'first us':>9s} {'last us':>8s} {'mean us':>8s} "
        f"{'wait us':>8s} {'work us':>8s} {'ready by':>8s} {'mark us':>8s}"
    ]
    for name in dict.fromkeys(r["stage"] for r in rows):  # ticket order
        got = [r for r in rows if r["stage"] == name]
        n = len(got)
        first = min(r["start_us"] for r in got)
        last = max(r["end_us"] for r in got)
        mean = sum(r["end_us"] - r["start_us"] for r in got) / n
        wait = sum(r["ready_us"] - r["start_us"] for r in got) / n
        ready = max(r["ready_us"] for r in got)
        marked = [r["mark_us"] - r["ready_us"] for r in got if r.get("mark_us") is not None]
        mark = f"{sum(marked) / len(marked):8.2f}" if marked else f"{'-':>8s}"
        lines.append(
            f"{name:10s} {n:5d} {first:9.1f} {last:8.1f} {mean:8.2f} {wait:8.2f} "
            f"{mean - wait:8.2f} {ready:8.1f} {mark}"
        )
    lines.append(
        f"span {max(r['end_us'] for r in rows):.1f} us over "
        f"{len({r['program'] for r in rows})} programs on {len({r.get('sm', 0) for r in rows})} SMs"
    )
    return "\n".join(lines)


def sharing(rows: list[dict]) -> str:
    """Per stage, the mean work (ready to end) of its items that ran alone on their SM and
    of those whose work overlapped another program's item on the same SM (the two share
    the SM's issue slots and memory pipeline): whether short items are slow because a
    neighbour streams. Empty when the rows name one SM only (the interpreter)."""
    if len({r.get("sm", 0) for r in rows}) < 2:
        return ""
    by_sm: dict[int, list[dict]] = {}
    for r in rows:
        by_sm.setdefault(r["sm"], []).append(r)
    lines = [f"{'stage':10s} {'alone':>5s} {'work us':>8s} {'shared':>6s} {'work us':>8s}"]
    for name in dict.fromkeys(r["stage"] for r in rows):  # ticket order
        alone, shared = [], []
        for r in (r for r in rows if r["stage"] == name):
            mates = (
                o
                for o in by_sm[r["sm"]]
                if o["program"] != r["program"]
                and o["start_us"] < r["end_us"]
                and o["end_us"] > r["ready_us"]
            )
            (shared if any(mates) else alone).append(r["end_us"] - r["ready_us"])
        mean = [f"{sum(v) / len(v):8.2f}" if v else f"{'-':>8s}" for v in (alone, shared)]
        lines.append(f"{name:10s} {len(alone):5d} {mean[0]} {len(shared):6d} {mean[1]}")
    return "\n".join(lines)


def stage_deps(rows: list[dict], inputs: dict[str, Sequence[str]]) -> dict[int, list[int]]:
    """Ticket -> every ticket of the rows whose stage is among its own stage's `inputs` (a
    kernel's stages' inputs by name: the stages whose done pairs or pushes its items wait
    for): `critical_path`'s deps from the rows alone, as coarse as a stage (a row's item
    counts every row's inputs)."""
    by_stage: dict[str, list[int]] = {}
    for r in rows:
        by_stage.setdefault(r["stage"], []).append(r["ticket"])
    return {
        r["ticket"]: [t for src in inputs.get(r["stage"], ()) for t in by_stage.get(src, [])]
        for r in rows
    }


def critical_path(rows: list[dict], deps: dict[int, list[int]]) -> list[dict]:
    """The chain of items that held the launch's last end, in launch order. From the item
    that ended last, step back to what held it: the input it waited for longest (of its
    `deps`, the tickets whose done pairs or pushes it waits for: the one that ended last,
    if after the item started), else the item its program ran before it (the item waited
    for a program, not an input). Each link is the item's row plus `held_by` ("input",
    "program", or "" for the chain's first), `handoff_us` (from its holder's end to its
    own work: its ready, or its holder's end where it polled for the input itself) and
    `work_us` (the rest, to its end): the links' hand-offs and work add up to the span
    from the first link's start."""
    by_ticket = {r["ticket"]: r for r in rows}
    by_program: dict[int, list[dict]] = {}
    for r in rows:
        by_program.setdefault(r["program"], []).append(r)
    chain: list[dict] = []
    r = max(rows, key=lambda r: r["end_us"])
    while r is not None:
        link = dict(r, held_by="", handoff_us=r["ready_us"] - r["start_us"])
        link["work_us"] = r["end_us"] - r["ready_us"]
        chain.append(link)
        inputs = [by_ticket[t] for t in deps.get(r["ticket"], []) if t in by_ticket]
        held = max(inputs, key=lambda d: d["end_us"], default=None)
        if held is not None and held["end_us"] > r["start_us"]:
            begin = max(r["ready_us"], held["end_us"])
            link.update(held_by="input", handoff_us=begin - held["end_us"])
            link["work_us"] = r["end_us"] - begin
            r = held
            continue
        before = [o for o in by_program[r["program"]] if o["end_us"] <= r["start_us"]]
        r = max(before, key=lambda o: o["end_us"], default=None)
        if r is not None:
            link.update(held_by="program", handoff_us=link["ready_us"] - r["end_us"])
    return chain[::-1]


def path_table(chain: list[dict]) -> str:
    """`critical_path`'s chain, a line a link: stage, ticket, what held it, its hand-off
    and work (us) and its end; then the sums of hand-offs and work."""
    lines = [
        f"{'stage':10s} {'ticket':>6s} {'held by':>8s} {'handoff':>8s} {'work':>8s} {'end':>8s}"
    ]
    for c in chain:
        lines.append(
            f"{c['stage']:10s} {c['ticket']:6d} {c['held_by'] or '-':>8s} "
            f"{c['handoff_us']:8.2f} {c['work_us']:8.2f} {c['end_us']:8.1f}"
        )
    lines.append(
        f"hand-offs {sum(c['handoff_us'] for c in chain):.1f} us, "
        f"work {sum(c['work_us'] for c in chain):.1f} us over {len(chain)} items"
    )
    return "\n".join(lines)


def show(rows: list[dict], heading: str, path=None, title: str = "", deps=None) -> None:
    """Print `heading` and the rows' `summary` (and, given `deps`, their `critical_path`);
    draw them at `path` (with `title`) when given, and write the rows beside the picture as
    JSON (same name, `.json`), so a stage's span can be read per layer or per program
    later: what every kernel's timeline benchmark shows of a launch."""
    print(f"-- {heading}")
    print(summary(rows), flush=True)
    if deps is not None:
        print(f"-- what held the last end\n{path_table(critical_path(rows, deps))}", flush=True)
    shared = sharing(rows)
    if shared:
        print(f"-- items alone on their SM or beside another program's\n{shared}", flush=True)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).with_suffix(".json").write_text(json.dumps(rows))
        plot(rows, path, title)


def plot(rows: list[dict], path, title: str = "") -> None:
    """Items as bars over programs (x: us from the launch's first stamp), one colour a stage,
    pale while the item waits for its inputs, saved at `path` (its folder made if missing).
    Needs matplotlib (mono-tools depends on it; the kernel packages do not)."""
    try:
        import matplotlib
    except ImportError as err:
        raise RuntimeError(
            f"timeline picture {path}: needs matplotlib (pip install matplotlib)"
        ) from err

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["stage"] for r in rows))  # ticket order
    palette = plt.get_cmap("tab20").colors  # K2 has 17 stages: cycle past 20
    colours = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, 6))
    for name in names:
        got = [r for r in rows if r["stage"] == name]
        # the wait (start to ready) pale, the work (ready to end) solid and in the legend
        for lo, hi, alpha, label in (
            ("start_us", "ready_us", 0.3, None),
            ("ready_us", "end_us", 1.0, name),
        ):
            ax.barh(
                [r["program"] for r in got],
                [r[hi] - r[lo] for r in got],
                left=[r[lo] for r in got],
                height=0.9,
                color=colours[name],
                alpha=alpha,
                label=label,
            )
    ax.set_xlabel("us from the launch's first item")
    ax.set_ylabel("program")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
