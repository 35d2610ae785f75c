"""One worker process per rank, joined in a gloo group, reporting events to the parent.

`mono` needs more than a test helper's spawn-and-wait: the parent shows progress while the
ranks work, gives up on a rank that stops reporting (a hang must end in a failed check,
not a stuck command) and ends every process it started.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

GROUP_TIMEOUT_S = 60  # a gloo collective that a dead peer never joins fails after this


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str
    data: dict = field(default_factory=dict)


class Reporter:
    """The worker's end of its own pipe to the parent. A send is in the pipe when it returns,
    so what a rank said survives its dying a moment later (a queue's feeder thread, which
    writes later, lost a sent answer when a peer's exit aborted the rank on a loaded CI
    machine)."""

    def __init__(self, rank: int, conn: Any) -> None:
        self.rank, self.conn = rank, conn
        self._lock = threading.Lock()  # one message at a time, whichever thread sends

    def send(self, kind: str, **data: Any) -> None:
        with self._lock:
            self.conn.send(Event(self.rank, kind, data))


def _entry(target, rank, world, store, env, conn, payload) -> None:
    os.environ.update(env)
    reporter = Reporter(rank, conn)
    try:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        )
        reporter.send("ready")
        target(rank, world, dist.group.WORLD, reporter, payload)
        reporter.send("exit")
    except BaseException:
        reporter.send("fatal", error=traceback.format_exc())
        raise SystemExit(3) from None
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - teardown must not mask the result
            pass
        conn.close()


class RankProcesses:
    """Start `target(rank, world, group, reporter, payload)` in `world` processes.

    They fork from a server that imported `preload` (torch first) once, with `env` set, and
    never touched a GPU: on a small machine importing torch in every rank is most of the
    start-up time, and a rank forked from a process with a live CUDA context would be broken.
    """

    def __init__(
        self,
        target: Callable,
        world: int,
        payload: Any,
        env: dict[str, str] | None = None,
        preload: tuple[str, ...] = ("torch", "torch.distributed"),
    ) -> None:
        self.ctx = mp.get_context("forkserver")
        # one host: gloo over loopback, whatever the host name resolves to
        self.env = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"), **(env or {})}
        self.preload = list(preload)
        pipes = [self.ctx.Pipe(duplex=False) for _ in range(world)]
        self.readers = {reader: rank for rank, (reader, _) in enumerate(pipes)}  # still open
        self._writers = [writer for _, writer in pipes]  # the parent's copies, closed at start
        self.pending: deque[Event] = deque()  # read from the pipes, not yet handed out
        self.backlog: list[Event] = []  # events read while waiting for another kind
        self.broken = False  # a rank was lost: stop at once instead of waiting for the rest
        self.world = world
        self._dir = tempfile.TemporaryDirectory(prefix="mono-ranks-")
        store = os.path.join(self._dir.name, "store")
        self.procs = [
            self.ctx.Process(
                target=_entry,
                args=(target, rank, world, store, self.env, self._writers[rank], payload),
                name=f"mono-rank-{rank}",
                daemon=True,
            )
            for rank in range(world)
        ]

    def __enter__(self) -> RankProcesses:
        saved = dict(os.environ)
        os.environ.update(self.env)  # the server starts (and preloads) with the ranks' env
        try:
            self.ctx.set_forkserver_preload(self.preload)
            for proc in self.procs:
                proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
            for writer in self._writers:  # each rank now holds the only writing end of its pipe
                writer.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(0.0 if self.broken or exc[0] is not None else 10.0)

    def _read(self, conn: Any) -> None:
        """One message from a ready pipe into `pending`; a pipe at its end is dropped."""
        try:
            self.pending.append(conn.recv())
        except (EOFError, OSError):
            del self.readers[conn]
            conn.close()

    def next_event(self, timeout_s: float) -> Event | None:
        if not self.pending:
            if self.readers:
                for conn in mpc.wait(list(self.readers), timeout_s):
                    self._read(conn)
            else:
                time.sleep(timeout_s)
        return self.pending.popleft() if self.pending else None

    def sent_so_far(self) -> list[Event]:
        """Every event any rank has sent until now, read without waiting. Sends are written
        before they return, so once a rank has failed or ended, what its peers said before it
        (a barrier earlier) is all here."""
        while ready := mpc.wait(list(self.readers), 0):
            for conn in ready:
                self._read(conn)
        events = list(self.pending)
        self.pending.clear()
        return events

    def exited(self) -> dict[int, int]:
        """Ranks whose process has ended, with the exit code."""
        return {r: p.exitcode for r, p in enumerate(self.procs) if p.exitcode is not None}

    def wait_all(self, *args, **kwargs) -> tuple[dict[int, dict], str]:
        got, problem = self._wait_all(*args, **kwargs)
        self.broken = self.broken or bool(problem)
        return got, problem

    def _wait_all(
        self,
        kind: str,
        timeout_s: float,
        step: str | None = None,
        tick: Callable[[], object] = lambda: None,
    ) -> tuple[dict[int, dict], str]:
        """Every rank's event of `kind` (for `step`, when given), or also why some never came:
        a crash, an ended process, or silence past `timeout_s` (a hang)."""
        got: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s

        def take(event: Event) -> str:
            if event.kind == kind and event.data.get("step") == step:
                got[event.rank] = event.data
            elif event.kind == "fatal":
                return f"rank {event.rank} crashed: {event.data['error'].strip().splitlines()[-1]}"
            else:
                self.backlog.append(event)
            return ""

        def lost(problem: str) -> tuple[dict[int, dict], str]:
            for event in self.sent_so_far():  # the others' answers, sent before the loss
                take(event)
            return got, problem

        earlier, self.backlog = self.backlog, []
        for event in earlier:
            if problem := take(event):
                return lost(problem)
        while len(got) < self.world:
            event = self.next_event(0.1)
            tick()
            if event is not None:
                if problem := take(event):
                    return lost(problem)
                continue
            if any(r not in got for r in self.exited()):
                for event in self.sent_so_far():  # an ended rank's last words are all here
                    if problem := take(event):
                        return lost(problem)
                dead = {r: c for r, c in self.exited().items() if r not in got}
                if dead:
                    codes = ", ".join(f"rank {r} (exit {c})" for r, c in sorted(dead.items()))
                    return lost(f"process ended early: {codes}")
            if time.monotonic() > deadline:
                silent = ", ".join(str(r) for r in range(self.world) if r not in got)
                return got, f"no answer from rank(s) {silent} within {timeout_s:.0f} s (hang)"
        return got, ""

    def stop(self, grace_s: float = 10.0) -> None:
        """Let workers finish for `grace_s`, then terminate, then kill: never leave one behind."""
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in list(self.readers):
            conn.close()
        self.readers.clear()
        self._dir.cleanup()
