"""One worker process per rank, joined in a gloo group, reporting events to the parent.

`mono` needs more than a test helper's spawn-and-wait: the parent shows progress while the
ranks work, gives up on a rank that stops reporting (a hang must end in a failed check,
not a stuck command) and ends every process it started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

GROUP_TIMEOUT_S = 60  # a gloo collective that a dead peer never joins fails after this
DRAIN_QUIET_S = 3.0  # silence that ends the reading of an ended rank's last words


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str
    data: dict = field(default_factory=dict)


class Reporter:
    """The worker's end of the event queue."""

    def __init__(self, rank: int, events: Any) -> None:
        self.rank, self.events = rank, events

    def send(self, kind: str, **data: Any) -> None:
        self.events.put(Event(self.rank, kind, data))


def _entry(target, rank, world, store, env, events, payload) -> None:
    os.environ.update(env)
    reporter = Reporter(rank, events)
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
        events.close()
        events.join_thread()


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
        self.events = self.ctx.Queue()
        self.backlog: list[Event] = []  # events read while waiting for another kind
        self.broken = False  # a rank was lost: stop at once instead of waiting for the rest
        self.world = world
        self._dir = tempfile.TemporaryDirectory(prefix="mono-ranks-")
        store = os.path.join(self._dir.name, "store")
        self.procs = [
            self.ctx.Process(
                target=_entry,
                args=(target, rank, world, store, self.env, self.events, payload),
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
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(0.0 if self.broken or exc[0] is not None else 10.0)

    def next_event(self, timeout_s: float) -> Event | None:
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            return None

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
        a crash, an ended process, or silence past `timeout_s` (a hang). `tick` runs ~10/s."""
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

        earlier, self.backlog = self.backlog, []
        for event in earlier:
            if problem := take(event):
                return got, problem
        while len(got) < self.world:
            event = self.next_event(0.1)
            tick()
            if event is not None:
                if problem := take(event):
                    return got, problem
                continue
            if any(r not in got for r in self.exited()):
                # the pipe may still hold a dead rank's last words, and a living rank's answer
                # may still be on its way (a loaded machine): read until the living have
                # answered or the deadline passed, then until the pipe is quiet for DRAIN_QUIET_S
                while (event := self.next_event(self._drain_wait(got, deadline))) is not None:
                    if problem := take(event):
                        return got, problem
                dead = {r: c for r, c in self.exited().items() if r not in got}
                if dead:
                    codes = ", ".join(f"rank {r} (exit {c})" for r, c in sorted(dead.items()))
                    return got, f"process ended early: {codes}"
            if time.monotonic() > deadline:
                silent = ", ".join(str(r) for r in range(self.world) if r not in got)
                return got, f"no answer from rank(s) {silent} within {timeout_s:.0f} s (hang)"
        return got, ""

    def _drain_wait(self, got: dict[int, dict], deadline: float) -> float:
        """How long to wait for the next event once a rank has ended without answering:
        the living get the rest of the deadline; an ended rank's words already sent get
        DRAIN_QUIET_S of silence (on a loaded 2-core machine 1 s lost a sent answer)."""
        ended = self.exited()
        living = [r for r in range(self.world) if r not in got and r not in ended]
        return max(DRAIN_QUIET_S, deadline - time.monotonic()) if living else DRAIN_QUIET_S

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
        self.events.close()
        self.events.cancel_join_thread()
        self._dir.cleanup()
