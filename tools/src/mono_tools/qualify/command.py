"""Run `mono qualify`: start the ranks, follow every check live, print the pass/fail table,
write JSON on request; exit status 1 when any check fails."""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass, field

from mono_tools import outputs, table
from mono_tools.errors import UsageError
from mono_tools.machine import detect, resolve_backend, resolve_ranks
from mono_tools.progress import Progress
from mono_tools.qualify.checks import BY_NAME, CHECKS, Check
from mono_tools.qualify.worker import run_checks
from mono_tools.ranks import RankProcesses

HOST_RANKS = 2  # default on a machine without GPUs: the smallest world that has peers
HOST_MAX_RANKS = 8
SETUP_TIMEOUT_S = 120.0  # imports and the gloo rendezvous of every rank
START = "start ranks"
# imported once, before the ranks fork (see RankProcesses); a missing one is skipped there
PRELOAD = ("torch", "torch.distributed", "triton", "mono_peer", "mono_runtime")


@dataclass
class Result:
    name: str
    status: str  # pass | fail | skip | not run
    seconds: float = 0.0
    detail: str = ""
    per_rank: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "per_rank": self.per_rank,
        }


def add_parser(commands) -> None:
    p = commands.add_parser(
        "qualify",
        help="check this machine before it serves (peer memory, all-reduce, faults, builds)",
        description="Check this machine: one process per GPU (or host processes with the "
        "Triton interpreter where there is none) runs every check; exit status 1 on any "
        "failure.",
    )
    p.add_argument("--ranks", type=int, help="ranks (default: every GPU; 2 without GPUs)")
    p.add_argument("--backend", default="auto", choices=("auto", "cuda", "hip", "host"))
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--only",
        metavar="CHECKS",
        help=f"comma-separated subset of: {', '.join(c.name for c in CHECKS)}",
    )
    # For testing qualify itself: one rank overruns its deadline in the all-reduce check,
    # so the check must fail and the command exit 1.
    p.add_argument("--testing-force-fault", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def _plan(only: str | None) -> list[Check]:
    if only is None:
        return list(CHECKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise UsageError(
            f"--only {only!r}: unknown check(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(BY_NAME)}"
        )
    return [c for c in CHECKS if c.name in names]


def run(args: argparse.Namespace) -> int:
    machine = detect()
    backend = resolve_backend(args.backend, machine)
    world = resolve_ranks(args.ranks, backend, machine, HOST_RANKS)
    if backend == "host" and world > HOST_MAX_RANKS:
        raise UsageError(f"--ranks {world}: the host backend runs at most {HOST_MAX_RANKS}")
    plan = _plan(args.only)
    json_file = outputs.JsonFile(args.json) if args.json else None
    if args.testing_force_fault and "tagged all-reduce" not in [c.name for c in plan]:
        raise UsageError("--testing-force-fault acts in the 'tagged all-reduce' check: run it")

    where = machine.gpu_name if backend != "host" else "host processes, Triton interpreter"
    print(f"mono qualify: {world} rank(s), backend {backend} ({where})", flush=True)
    started = time.monotonic()
    results = _run_plan(plan, world, backend, args.testing_force_fault)
    total = time.monotonic() - started

    failed = [r for r in results if r.status in ("fail", "not run")]
    print()
    name_width = max(len(r.name) for r in results)
    room = max(40, shutil.get_terminal_size((150, 24)).columns - name_width - 20)
    print(
        table.render(
            ["check", "result", "time", "detail"],
            [
                [r.name, r.status.upper(), f"{r.seconds:.1f} s", table.fit(r.detail, room)]
                for r in results
            ],
            right={2},
        )
    )
    _print_timelines(results)
    if json_file:  # before the verdict: a run whose results were lost reports no PASS
        json_file.write(
            {
                "command": "qualify",
                "passed": not failed,
                "ranks": world,
                "backend": backend,
                "seconds": round(total, 3),
                "machine": machine.as_dict(),
                "checks": [r.as_dict() for r in results],
            },
        )
        print(f"\nresults written to {json_file.path}")
    verdict = "PASS" if not failed else f"FAIL ({len(failed)} of {len(results)} checks)"
    print(f"\nqualify: {verdict} in {total:.0f} s")
    return 1 if failed else 0


def _print_timelines(results: list[Result]) -> None:
    """What each rank's MonoFault said: the evidence behind a fault check, or the reason a
    check failed."""
    for result in results:
        reports = [
            (row["rank"], row["info"]["timeline"])
            for row in result.per_rank
            if row.get("info", {}).get("timeline")
        ]
        if reports:
            print(f"\n{result.name}: what each rank reported")
            for rank, text in reports:
                lines = text.splitlines()
                print(f"  rank {rank}: {lines[0]}")
                for line in lines[1:]:
                    print(f"    {line.strip()}")


def _run_plan(plan: list[Check], world: int, backend: str, force_fault: bool) -> list[Result]:
    progress = Progress()
    results: list[Result] = []
    runnable = [c for c in plan if backend != "host" or not c.gpu_only]
    payload = {
        "backend": backend,
        "checks": [c.name for c in runnable],
        "force_fault": force_fault,
    }
    env = {"TRITON_INTERPRET": "1"} if backend == "host" else {}
    began = time.monotonic()
    progress.start(START)
    with RankProcesses(run_checks, world, payload, env, PRELOAD) as procs:
        follow = _Follower(procs, progress, world)
        start = follow.setup(began)
        results.append(start)
        broken = start.status != "pass"
        for check in plan:
            if check.gpu_only and backend == "host":
                results.append(Result(check.name, "skip", detail="needs a GPU"))
                progress.finish(check.name, "skip", 0.0, "needs a GPU")
            elif broken:
                results.append(Result(check.name, "not run", detail="the ranks stopped"))
            else:
                result = follow.check(check)
                results += [result, *_absent_rows(result)]
                broken = result.status == "fail" and follow.lost
    return results


def _absent_rows(result: Result) -> list[Result]:
    """A SKIP row, with its reason, for each build a check found absent or could not run on
    this machine: a build that was not checked here never hides inside a PASS row."""
    absent: dict[str, str] = {}
    for row in result.per_rank:
        absent.update(row.get("info", {}).get("absent", {}))
    return [Result(f"{result.name}: {label}", "skip", detail=why) for label, why in absent.items()]


class _Follower:
    """Collects every rank's events for one step, with the spinner turning meanwhile."""

    def __init__(self, procs: RankProcesses, progress: Progress, world: int) -> None:
        self.procs, self.progress, self.world = procs, progress, world
        self.lost = False  # ranks were lost (crash, hang): later checks cannot run

    def _wait(self, step: str | None, kind: str, timeout_s: float):
        got, problem = self.procs.wait_all(kind, timeout_s, step, self.progress.tick)
        self.lost = self.lost or bool(problem)
        return got, problem

    def setup(self, began: float) -> Result:
        name = START
        got, problem = self._wait(None, "ready", SETUP_TIMEOUT_S)
        seconds = time.monotonic() - began
        if problem:
            self.progress.finish(name, "fail", seconds, problem)
            return Result(name, "fail", seconds, problem)
        detail = f"{self.world} process(es) joined a gloo group"
        self.progress.finish(name, "pass", seconds, detail)
        return Result(name, "pass", seconds, detail)

    def check(self, check: Check) -> Result:
        self.progress.start(check.name)
        began = time.monotonic()
        got, problem = self._wait(check.name, "end", check.timeout_s)
        seconds = time.monotonic() - began
        per_rank = [{"rank": r, **got[r]} for r in sorted(got)]
        for row in per_rank:
            row.pop("step", None)
        if problem:
            result = Result(check.name, "fail", seconds, problem, per_rank)
        else:
            result = _combine(check.name, per_rank, seconds)
        self.progress.finish(result.name, result.status, seconds, result.detail)
        return result


def _combine(name: str, per_rank: list[dict], seconds: float) -> Result:
    """One verdict from every rank's: any failure fails; every rank skipping skips."""
    statuses = {row["status"] for row in per_rank}
    if "fail" in statuses:
        bad = [row for row in per_rank if row["status"] == "fail"]
        firsts = {row["detail"].splitlines()[0] if row["detail"] else "" for row in bad}
        if len(firsts) == 1:
            who = (
                "every rank"
                if len(bad) == len(per_rank)
                else ("rank " + ", ".join(str(row["rank"]) for row in bad))
            )
            detail = f"{who}: {firsts.pop()}"
        else:
            detail = "; ".join(f"rank {r['rank']}: {r['detail'].splitlines()[0]}" for r in bad)
        return Result(name, "fail", seconds, detail, per_rank)
    status = "skip" if statuses == {"skip"} else "pass"
    details = list(dict.fromkeys(row["detail"] for row in per_rank if row["status"] == status))
    return Result(name, status, seconds, "; ".join(details), per_rank)
