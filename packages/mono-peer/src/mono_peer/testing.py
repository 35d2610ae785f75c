"""spawn: run a function on N ranks, as real processes joined by a gloo group;
child_json: a script run in a fresh interpreter, its last line read as JSON.

For tests of anything collective (this package's and the packages built on it). The
parent owns the rendezvous store (no free-port race), and every wait is bounded: a rank
that raises, dies or outlives the timeout makes the whole call fail with every rank's
traceback or status.

Ranks start from a forkserver that has imported torch once (a fresh interpreter, like
"spawn", but without paying torch's ~3 s import per rank: on a 2-core CI machine that is
most of a multi-rank test's time). Each rank applies the parent's environment as it is at
the call, so variables set since the server started (TRITON_INTERPRET=1) still reach it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import multiprocessing as mp
import os
import pickle
import queue
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

PRELOAD = ["torch", "torch.distributed", "mono_peer.testing"]
"""What the forkserver imports once for every rank it starts (no triton: ranks may need
TRITON_INTERPRET set before triton's first import)."""

GRACE_S = 3.0
"""After one rank fails, how long the others get to report before they are killed."""


def _function_ref(fn: Callable[..., Any]) -> tuple[str, str, str | None]:
    try:
        path = inspect.getfile(fn)
    except TypeError:
        path = None
    return fn.__module__, fn.__qualname__, path


def _resolve(ref: tuple[str, str, str | None]) -> Callable[..., Any]:
    """Import fn in the child; load its file by path when its module is not importable
    (pytest's importlib mode names test modules that no child can import)."""
    module_name, qualname, path = ref
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    found = getattr(module, "__file__", None) or ""
    same_file = module is not None and (
        path is None or os.path.realpath(found) == os.path.realpath(path)
    )
    if not same_file:
        if path is None:
            raise ImportError(f"spawn: cannot import {module_name} in a child process")
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _child(rank, world, port, timeout_s, ref, args, env, results) -> None:
    os.environ.clear()
    os.environ.update(env)
    try:
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        try:
            value = _resolve(ref)(rank, world, dist.group.WORLD, *args)
        finally:
            dist.destroy_process_group()
        payload = pickle.dumps(value)  # here, so an unpicklable result becomes a traceback
        results.put((rank, True, payload))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _loopback_listener() -> tuple[int, int]:
    """(port, fd) of a socket listening on 127.0.0.1 for the rendezvous store: TCPStore alone
    would listen on every interface, open to the network."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener.getsockname()[1], listener.detach()


def spawn(
    fn: Callable[..., Any],
    world: int,
    timeout_s: float,
    *args: Any,
    env: dict[str, str] | None = None,
    start_method: str = "forkserver",
    may_die: tuple[int, ...] = (),
) -> list[Any]:
    """Run ``fn(rank, world, group, *args)`` on ``world`` spawned processes; return their results.

    ``fn`` must be a module-level function; ``args`` and the results must pickle. ``env``
    is applied in each child, over the parent's environment, before ``fn``'s module is
    imported (e.g. TRITON_INTERPRET=1). ``start_method="spawn"`` gives every rank a
    brand-new interpreter instead of a forkserver child (slower, nothing preloaded).
    ``may_die`` names ranks that kill themselves on purpose (tests of a lost rank): their
    death is no failure, and their result is None.
    Raises AssertionError naming every rank's traceback or status if any rank raises, dies,
    or the timeout passes; every child is then killed.
    """
    if world < 1:
        raise ValueError(f"spawn: world must be >= 1, got {world}")
    import torch.distributed as dist

    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server first starts
    child_env = {"GLOO_SOCKET_IFNAME": "lo", **os.environ, **(env or {})}
    port, fd = _loopback_listener()
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world,
        True,
        timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=fd,  # the store owns it from here
    )
    results = ctx.Queue()
    ref = _function_ref(fn)
    procs = [
        ctx.Process(
            target=_child,
            args=(rank, world, store.port, timeout_s, ref, args, child_env, results),
            name=f"mono-peer-rank{rank}",
            daemon=True,
        )
        for rank in range(world)
    ]
    outcome: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.start()
        timed_out = _collect(procs, results, outcome, deadline, may_die)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        results.close()
        del store
    failed = [r for r in range(world) if not outcome.get(r, (False,))[0]]
    if failed:
        raise AssertionError(_report(procs, outcome, timeout_s, timed_out))
    return [pickle.loads(outcome[r][1]) for r in range(world)]


def _collect(procs, results, outcome, deadline, may_die=()) -> bool:
    """Drain results until every rank reported, one failed (plus a grace), or time ran out
    (then return True). A rank of ``may_die`` that died reports None."""
    world = len(procs)
    first_failure: float | None = None
    while len(outcome) < world:
        now = time.monotonic()
        if now >= deadline:
            return True
        if first_failure is not None and now >= first_failure + GRACE_S:
            return False
        try:
            rank, ok, value = results.get(timeout=0.05)
        except queue.Empty:
            dead = [
                r
                for r, p in enumerate(procs)
                if r not in outcome and not p.is_alive() and p.exitcode is not None
            ]
            for r in set(dead) & set(may_die):
                outcome[r] = (True, pickle.dumps(None))
            # a dead rank may still have a result in flight: give the pipe one more look
            if set(dead) - set(may_die) and first_failure is None:
                first_failure = now
            continue
        outcome[rank] = (ok, value)
        if not ok and first_failure is None:
            first_failure = now
    return False


def _report(procs, outcome, timeout_s, timed_out) -> str:
    why = f"timed out after {timeout_s} s" if timed_out else "a rank failed"
    lines = [f"spawn: {len(procs)} ranks, not all succeeded ({why})"]
    for rank, p in enumerate(procs):
        if rank in outcome:
            ok, value = outcome[rank]
            lines.append(f"--- rank {rank}: " + ("returned" if ok else "raised"))
            if not ok:
                lines.append(value.rstrip())
        else:
            status = (
                "killed (still running)"
                if p.exitcode in (-9, None)
                else (f"died with exit code {p.exitcode} before reporting")
            )
            lines.append(f"--- rank {rank}: {status}")
    return "\n".join(lines)


def child_json(argv: list[str], timeout_s: float, **env: str) -> tuple[Any, str]:
    """Run `python *argv` in a fresh interpreter with `env` added to this environment
    (TRITON_INTERPRET is read when a kernel is defined, so a test that wants the
    interpreter, or compiled kernels, beside others runs in a child): (its last stdout line
    as JSON, its stderr). A failing child fails the caller with the ends of its output."""
    proc = subprocess.run(
        [sys.executable, *argv],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
