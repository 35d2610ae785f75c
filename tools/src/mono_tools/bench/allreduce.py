"""`mono bench allreduce`: the runtime's in-kernel tagged all-reduce + residual + RMSNorm of
S x 6144 bf16 rows, against NCCL's all-reduce through torch.distributed and torch's
symmetric-memory one-shot all-reduce (each followed by a torch.compile'd residual + norm),
all under CUDA graph replay, one process per GPU."""

from __future__ import annotations

import argparse

from mono_tools.bench.results import BenchResult, Point
from mono_tools.errors import CommandFailed
from mono_tools.machine import Machine, resolve_ranks
from mono_tools.ranks import RankProcesses, Reporter

HIDDEN = 6144  # MiniMax-M3's hidden size
EPS = 1e-6
AGREE_REL = 1e-2  # NCCL sums in its own order and precision: bf16 rounding apart, no more
NCCL = "NCCL + norm"
SYMM = "symm-mem one-shot + norm"
CALLS_PER_GRAPH = 20  # back-to-back calls a graph: the replay's own launch cost vanishes


def measure(args: argparse.Namespace, machine: Machine) -> BenchResult:
    world = resolve_ranks(args.ranks, machine.vendor or "cuda", machine, host_default=1)
    print(f"measuring on {world} rank(s), one process per GPU ...", flush=True)
    payload = {"rows": list(args.rows), "hidden": HIDDEN}
    preload = ("torch", "torch.distributed", "triton", "mono_runtime")
    with RankProcesses(_rank, world, payload, preload=preload) as procs:
        _, problem = procs.wait_all("ready", 180)
        if not problem:
            got, problem = procs.wait_all("result", 900, step="allreduce")
    if problem:
        raise CommandFailed(f"bench allreduce: {problem}")
    first = got[0]
    points = []
    for row in first["points"]:
        # a collective is as slow as its slowest rank
        slowest = {k: max(got[r]["by_rows"][str(row)][k] for r in got) for k in first["keys"]}
        points.append(
            Point(
                rows=row,
                kernel_us=slowest["mono"],
                baselines_us={k: v for k, v in slowest.items() if k != "mono"},
                bytes_moved=_bytes(row, HIDDEN, world),
            )
        )
    settings = {"hidden": HIDDEN, "ranks": world, "dtype": "bf16", **first["notes"]}
    return BenchResult(
        kernel="allreduce",
        kernel_label="mono tagged all-reduce + norm",
        device=f"{world} x {machine.gpu_name}",
        copy_gbps=min(got[r]["copy_gbps"] for r in got),
        points=points,
        settings=settings,
    )


def _bytes(rows: int, hidden: int, world: int) -> int:
    """Each rank reads every rank's partial, the residual and the weight, and writes the
    output and the new residual (the least any all-reduce + norm moves through HBM)."""
    return 2 * rows * hidden * (world + 3) + 2 * hidden


def _add_rmsnorm(x, residual, weight):
    """The stock residual add + RMSNorm, with the reference's roundings."""
    import torch

    z = (x.float() + residual.float()).to(torch.bfloat16)
    zf = z.float()
    rstd = torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + EPS)
    return (zf * rstd * weight.float()).to(torch.bfloat16), z


def _rank(rank: int, world: int, group, reporter: Reporter, payload: dict) -> None:
    import torch
    import torch.distributed as dist
    from mono_runtime.allreduce import AllreduceBuild, allreduce
    from mono_runtime.runner import MonoRunner
    from mono_runtime.timing import copy_bandwidth, graph_time

    def graph_us(fn):
        return graph_time(fn, calls=CALLS_PER_GRAPH) * 1e6

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    rows, hidden = payload["rows"], payload["hidden"]
    nccl = dist.new_group(backend="nccl")
    copy = copy_bandwidth(device) / 1e9
    build = AllreduceBuild(max(rows), hidden, world, residual=True, norm=True)
    runner = MonoRunner(
        device,
        group,
        rank,
        world,
        build.scratch_bytes + 64,
        build.peer_bytes,
        deadline_ns=60_000_000_000,  # the first launch compiles, at each rank's own pace
    )
    add_norm = torch.compile(_add_rmsnorm, dynamic=False)
    notes: dict = {}
    by_rows: dict = {}
    symm = _symmetric_memory(nccl, group, notes)
    for S in rows:
        g = torch.Generator().manual_seed(S)
        parts = [torch.randn(S, hidden, generator=g).bfloat16() for _ in range(world)]
        x = parts[rank].to(device)
        res = torch.randn(S, hidden, generator=g).bfloat16().to(device)
        w = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16().to(device)
        buf = torch.empty_like(x)

        def mono(x=x, res=res, w=w):
            runner.step_begin()
            return allreduce(runner, x, 0, res, w, EPS)

        def nccl_path(x=x, res=res, w=w, buf=buf):
            buf.copy_(x)
            dist.all_reduce(buf, group=nccl)
            return add_norm(buf, res, w)

        # the same answer first (eager), then the times
        ours, theirs = mono()[0], nccl_path()[0]
        torch.cuda.synchronize(device)
        runner.after_step()
        a, b = ours.double(), theirs.double()
        diff = ((a - b).norm() / b.norm()).item()
        if not diff <= AGREE_REL:
            raise RuntimeError(f"S={S}: mono and NCCL disagree (relative L2 error {diff:.3g})")
        times = {}
        dist.barrier(group=group)
        times["mono"] = graph_us(mono)
        runner.after_step()  # raises MonoFault if any wait of the replays gave up
        dist.barrier(group=group)
        times[NCCL] = graph_us(nccl_path)
        if symm is not None:
            t = symm.empty((S, hidden), dtype=torch.bfloat16, device=device)
            symm.rendezvous(t, nccl.group_name)

            def symm_path(x=x, res=res, w=w, t=t):
                t.copy_(x)
                out = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", nccl.group_name)
                return add_norm(out, res, w)

            dist.barrier(group=group)
            times[SYMM] = graph_us(symm_path)
        by_rows[str(S)] = times
        notes[f"relative L2 mono vs NCCL at S={S}"] = diff
    keys = list(by_rows[str(rows[0])])
    reporter.send(
        "result",
        step="allreduce",
        points=rows,
        by_rows=by_rows,
        keys=keys,
        copy_gbps=copy,
        notes=notes,
    )
    dist.barrier(group=group)
    runner.close()


def _symmetric_memory(nccl, group, notes: dict):
    """torch's symmetric memory module where this torch and GPU have it on every rank, else
    None (noted): an optional baseline must not make the ranks take different paths."""
    from mono_peer import tp_agree

    symm = None
    try:
        import torch
        import torch.distributed._symmetric_memory as symm

        probe = symm.empty((1, 8), dtype=torch.bfloat16, device="cuda")
        symm.rendezvous(probe, nccl.group_name)
        torch.ops.symm_mem.one_shot_all_reduce(probe, "sum", nccl.group_name)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - optional baseline: say why it is missing
        notes["symm-mem"] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
        symm = None
    if not tp_agree(symm is not None, group):
        notes.setdefault("symm-mem", "unavailable on another rank")
        return None
    return symm
