"""Run RankProcesses on targets that misbehave, in a process of its own (the forkserver needs
importable targets): `python rank_targets.py MODE...` with MODE in ok, big, hang, crash, exit;
prints what the parent saw, one line per mode."""

from __future__ import annotations

import json
import os
import sys
import time

from mono_tools.ranks import RankProcesses


def target(rank, world, group, reporter, mode):
    """Rank 0 answers; the last rank then answers or misbehaves as `mode` says. The barrier
    (not a sleep) makes rank 0's answer go out first, however loaded the machine is."""
    import torch.distributed as dist

    if rank != world - 1:
        reporter.send("done", step="work", value=rank * 10)
    dist.barrier(group)
    if rank == world - 1:
        if mode == "hang":
            time.sleep(600)
        if mode == "crash":
            raise RuntimeError("boom on purpose")
        if mode == "exit":
            os._exit(7)
        # "big": an answer past the pipe's buffer (the send blocks until the parent reads)
        blob = "x" * (1 << 18) if mode == "big" else ""
        reporter.send("done", step="work", value=rank * 10, blob=blob)


if __name__ == "__main__":
    for mode in sys.argv[1:]:
        began = time.monotonic()
        with RankProcesses(target, 2, mode) as procs:
            procs.wait_all("ready", 60)
            got, problem = procs.wait_all("done", 3.0, step="work")
        seen = {
            "got": sorted([r, d["value"]] for r, d in got.items()),
            "blob": sum(len(d.get("blob", "")) for d in got.values()),
            "problem": problem,
            "seconds": time.monotonic() - began,
        }
        print(mode, json.dumps(seen), flush=True)
