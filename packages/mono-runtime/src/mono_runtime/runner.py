"""MonoRunner: one rank's protocol state (PROTOCOL.md sections 1, 2, 5, 6).

One scratch buffer shared by every launch of the rank (their tags differ), the control
words (epoch, era base, deadline, fault injection), per-slot ticket counters, the
host-visible health words and the peer buffer whose head holds the alarm words.
"""

from __future__ import annotations

from typing import Any

import torch

from . import protocol as P
from .errors import MonoFault
from .health import timeline
from .kernel.layer_runner import LayerRunner
from .planner import agree

DEFAULT_DEADLINE_NS = 5_000_000_000
MAX_DEADLINE_NS = 60_000_000_000
"""A wait's upper bound: longer than any real step, short enough that a lost rank is noticed."""
CPU_NS_PER_POLL = 1_000_000
"""Under the interpreter the clock counts polls; a deadline in ns becomes ns // this."""


def _deadline_problem(deadline_ns: Any) -> str | None:
    if isinstance(deadline_ns, bool) or not isinstance(deadline_ns, int):
        return f"deadline_ns must be an int, got {deadline_ns!r}"
    if not 0 < deadline_ns <= MAX_DEADLINE_NS:
        return f"deadline_ns must be in 1..{MAX_DEADLINE_NS} (60 s), got {deadline_ns}"
    return None


def _problem(
    device: Any, rank: Any, world: Any, scratch_bytes: Any, peer_bytes: Any, deadline_ns: Any
) -> str | None:
    for name, v, low in (
        ("world", world, 1),
        ("scratch_bytes", scratch_bytes, 8),
        ("peer_bytes", peer_bytes, 8),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return f"{name} must be an int >= {low}, got {v!r}"
    if world > P.MAX_RANKS:
        return f"world {world} exceeds the {P.MAX_RANKS} alarm words of the peer head"
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        return f"rank must be an int in [0, {world}), got {rank!r}"
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        return f"device {device!r}: {exc}"
    return _deadline_problem(deadline_ns)


def _agree_values(values: dict[str, int], group: Any) -> None:
    """Refuse on every rank unless every rank passed the same values (a deadline that
    differs makes one rank give up while its peers still wait)."""
    from mono_peer.agree import agree_min

    both = agree_min([x for v in values.values() for x in (v, -v)], group)
    differ = [
        f"{name} differs between ranks ({both[2 * i]} to {-both[2 * i + 1]})"
        for i, name in enumerate(values)
        if both[2 * i] != -both[2 * i + 1]
    ]
    agree(differ, group, "this runner")


class MonoRunner(LayerRunner):
    """Collective: every rank of `group` (a gloo group, or None for one rank) builds it
    at the same point, with the same sizes and deadline. `deadline_ns` (at most 60 s) bounds
    every in-kernel wait (on a CPU device it counts polls: deadline_ns // CPU_NS_PER_POLL).

    All or nothing: the arguments, then each rank's allocation, then the peer buffer are
    agreed in turn, so a failure on any rank raises on every rank and keeps nothing.
    The lifecycle (closed until built, every method raising after `close()`) is
    LayerRunner's."""

    _closed_why = "its peer buffer is unmapped"

    def __init__(
        self,
        device: torch.device | str,
        group: Any,
        rank: int,
        world: int,
        scratch_bytes: int,
        peer_bytes: int,
        deadline_ns: int = DEFAULT_DEADLINE_NS,
        backend: str | None = None,
    ) -> None:
        from mono_peer import PeerBuffer

        problem = _problem(device, rank, world, scratch_bytes, peer_bytes, deadline_ns)
        agree([problem] if problem else [], group, "this runner")
        _agree_values(
            {
                "world": world,
                "scratch_bytes": scratch_bytes,
                "peer_bytes": peer_bytes,
                "deadline_ns": deadline_ns,
            },
            group,
        )
        self.device = torch.device(device)
        self.group, self.rank, self.world = group, rank, world
        self.cpu = self.device.type == "cpu"
        self.unit = "polls" if self.cpu else "ns"
        problem = self._allocate(scratch_bytes)
        try:
            agree([problem] if problem else [], group, "this runner")
            self.peer = PeerBuffer(
                P.PEER_HEAD + peer_bytes, group, rank, world, self.device, backend
            )
        except BaseException:
            self._drop_local()
            raise
        self._opened()  # the peer buffer is mapped on every rank
        self.set_deadline(deadline_ns)
        self._steps = 0  # since the last rezero
        self._fault: MonoFault | None = None
        self._slot = 0  # the next launch's tag slot in this step

    def _allocate(self, scratch_bytes: int) -> str | None:
        """Allocate this rank's device state; return why it could not be, or None."""
        try:
            if self.device.type == "cuda" and self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.ctl = torch.zeros(P.CTL_WORDS, dtype=torch.int64, device=self.device)
            self.tickets = torch.zeros(P.SLOTS, dtype=torch.int64, device=self.device)
            self.scratch = torch.zeros(scratch_bytes, dtype=torch.uint8, device=self.device)
            # Host-visible: pinned host memory is device-addressable at its host address
            # under unified addressing, so kernels write it and after_step reads it without
            # a copy.
            self.health = torch.zeros(P.HEALTH_WORDS, dtype=torch.int64, pin_memory=not self.cpu)
        except Exception as exc:  # out of memory, no GPU here: agreed by the caller
            self._drop_local()
            return (
                f"rank {self.rank} could not allocate {scratch_bytes} scratch bytes on "
                f"{self.device}: {str(exc).splitlines()[0]}"
            )
        return None

    def _drop_local(self) -> None:
        """Release this rank's device state (a failed construction keeps nothing)."""
        self.ctl = self.tickets = self.scratch = self.health = None

    @property
    def alarms(self) -> torch.Tensor:
        """int32 [world]: the alarm words at this rank's head (a view of the peer buffer)."""
        self._live()
        return self.peer.bytes[: 4 * self.world].view(torch.int32)

    @property
    def alarm(self) -> int:
        """The address of this rank's own alarm word, here."""
        self._live()
        return self.peer.local + 4 * self.rank

    # -- per step -------------------------------------------------------------------------
    def _step_begin(self) -> None:
        self.ctl[P.CTL_EPOCH : P.CTL_EPOCH + 1].add_(1)
        self._slot = 0

    def take_slot(self) -> int:
        """The next launch's tag slot in this step (which also names its ticket counter):
        one count for every kernel on this runner, so that K1 and K2 launching into one
        step never share a slot. step_begin() and reset() restart it at 0."""
        self._live()
        if self._slot >= P.SLOTS:
            raise ValueError(f"more than {P.SLOTS} launches in one step (call step_begin())")
        self._slot += 1
        return self._slot - 1

    def launch_args(self) -> dict[str, Any]:
        """What every protocol kernel takes: control words, health address (an int: it may
        be pinned host memory), scratch, ticket counters, and the interpreter switch."""
        self._live()
        return {
            "ctl": self.ctl,
            "health": self.health.data_ptr(),
            "scratch": self.scratch,
            "tickets": self.tickets,
            "CPU": self.cpu,
        }

    def peer_args(self) -> dict[str, Any]:
        """Every rank's peer-buffer base address (the alarm head; data past PEER_HEAD)."""
        self._live()
        return {"peers": self.peer.addresses, "rank": self.rank, "world": self.world}

    def runtime_args(self) -> dict[str, Any]:
        """A launch's RUNTIME_ARGS (`kernel.spec`), in their order: `launch_args()`'s ctl,
        health, tickets, then `peer_args()`'s peers, rank, world."""
        la, pa = self.launch_args(), self.peer_args()
        return {name: la[name] for name in ("ctl", "health", "tickets")} | pa

    def _after_step(self) -> None:
        """Normal case: one read of a host-visible word, no device sync. Raises MonoFault
        once this rank's kernels recorded a give-up (ranks whose peer gave up record one
        at their next poll, so every rank raises); every REZERO_EVERY steps it quiesces
        collectively and erases the buffers (PROTOCOL.md section 3)."""
        if self._fault is not None:
            raise self._fault
        if not self.cpu and torch.cuda.is_current_stream_capturing():
            return
        self._steps += 1
        if int(self.health[P.H_GIVEUPS]) != 0:
            raise self._faulted()
        if self._steps >= P.REZERO_EVERY:
            self._sync()
            from mono_peer import tp_agree

            if not tp_agree(int(self.health[P.H_GIVEUPS]) == 0, self.group):
                if int(self.health[P.H_GIVEUPS]):
                    raise self._faulted()
                self._fault = MonoFault("mono: another rank faulted before the era rezero")
                raise self._fault
            self._rezero()

    # -- faults ---------------------------------------------------------------------------
    def _faulted(self) -> MonoFault:
        self._sync()  # every wait is bounded: this ends, and the records are complete
        head, _, body = timeline(
            self.rank, self.health.tolist(), self.alarms.tolist(), self.unit
        ).partition("\n")
        self._fault = MonoFault(head, body)
        return self._fault

    def _reset(self) -> None:
        """Clear scratch, tickets, peer buffer (alarms included) and health, restart the
        tag era."""
        self._rezero()
        self._fault = None
        self._slot = 0

    def _rezero(self) -> None:
        from mono_peer import tp_agree

        self._sync()
        tp_agree(True, self.group)  # every rank's stores of the old era have landed
        self.scratch.zero_()
        self.tickets.zero_()
        self.peer.bytes.zero_()
        self.health.zero_()
        self.ctl[P.CTL_GIVEUPS] = 0
        self.ctl[P.CTL_ERA_BASE : P.CTL_ERA_BASE + 1].copy_(self.ctl[P.CTL_EPOCH : P.CTL_EPOCH + 1])
        self._sync()
        tp_agree(True, self.group)  # no rank stores into a peer that is still zeroing
        self._steps = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- settings -------------------------------------------------------------------------
    def _units(self, ns: int) -> int:
        return max(1, ns // CPU_NS_PER_POLL) if self.cpu else ns

    def set_deadline(self, deadline_ns: int) -> None:
        """Local: call it with the same value on every rank."""
        self._live()
        problem = _deadline_problem(deadline_ns)
        if problem:
            raise ValueError(problem)
        self.deadline_ns = deadline_ns
        self.ctl[P.CTL_DEADLINE] = self._units(deadline_ns)

    def _inject(self, rank: int | None, delay_ns: int) -> None:
        """The stall lasts `delay_ns` or until an alarm."""
        if rank is not None and not 0 <= rank < self.world:
            raise ValueError(f"inject: rank {rank} not in [0, {self.world})")
        self.ctl[P.CTL_FAULT_RANK] = 0 if rank is None else rank + 1
        self.ctl[P.CTL_FAULT_DELAY] = self._units(delay_ns) if delay_ns > 0 else 0

    def skip_steps(self, n: int) -> None:
        """Advance the epoch by n steps as if n empty steps had run (tests of the tag era
        and its rezero start near the era's end with it)."""
        self._live()
        self.ctl[P.CTL_EPOCH : P.CTL_EPOCH + 1].add_(n)
        self._steps += n

    def tag(self, slot: int) -> int:
        """The tag a launch of `slot` would use now (host mirror of `step_tag`; syncs)."""
        self._live()
        epoch, base = self.ctl[:2].tolist()
        return P.tag_of(epoch, base, slot)

    # -- device-side check ----------------------------------------------------------------
    def guard(self, x: torch.Tensor) -> None:
        """Fill floating `x` with NaN on the device when any alarm word at this rank's
        head is set; graph-capturable (a one-program launch). Call it after the layer
        loop so a step in which some rank gave up yields no finite logits."""
        self._live()
        from .guard import guard_nan

        guard_nan(x, self.peer.addresses, self.rank, self.world)

    def _release(self) -> None:
        self.peer.close()
