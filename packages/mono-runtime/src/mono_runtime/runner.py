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
from .planner import agree

DEFAULT_DEADLINE_NS = 5_000_000_000
CPU_NS_PER_POLL = 1_000_000
"""Under the interpreter the clock counts polls; a deadline in ns becomes ns // this."""


def _problem(rank: Any, world: Any, scratch_bytes: Any, peer_bytes: Any) -> str | None:
    for name, v, low in (("world", world, 1), ("scratch_bytes", scratch_bytes, 8),
                         ("peer_bytes", peer_bytes, 8)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return f"{name} must be an int >= {low}, got {v!r}"
    if world > P.MAX_RANKS:
        return f"world {world} exceeds the {P.MAX_RANKS} alarm words of the peer head"
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        return f"rank must be an int in [0, {world}), got {rank!r}"
    return None


class MonoRunner:
    """Collective: every rank of `group` (a gloo group, or None for one rank) builds it
    at the same point, with the same sizes. `deadline_ns` bounds every in-kernel wait
    (on a CPU device it counts polls: deadline_ns // CPU_NS_PER_POLL)."""

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

        problem = _problem(rank, world, scratch_bytes, peer_bytes)
        agree([problem] if problem else [], group, "this runner")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.group, self.rank, self.world = group, rank, world
        self.cpu = self.device.type == "cpu"
        self.unit = "polls" if self.cpu else "ns"
        self.ctl = torch.zeros(P.CTL_WORDS, dtype=torch.int64, device=self.device)
        self.tickets = torch.zeros(P.SLOTS, dtype=torch.int64, device=self.device)
        self.scratch = torch.zeros(scratch_bytes, dtype=torch.uint8, device=self.device)
        # Host-visible: pinned host memory is device-addressable at its host address under
        # unified addressing, so kernels write it and after_step reads it without a copy.
        self.health = torch.zeros(P.HEALTH_WORDS, dtype=torch.int64,
                                  pin_memory=not self.cpu)
        self.peer = PeerBuffer(P.PEER_HEAD + peer_bytes, group, rank, world, self.device,
                               backend)
        self.alarms = self.peer.bytes[: 4 * world].view(torch.int32)
        self.alarm = self.peer.local + 4 * rank  # this rank's alarm word, here
        self.set_deadline(deadline_ns)
        self._steps = 0  # since the last rezero
        self._fault: MonoFault | None = None

    # -- per step -------------------------------------------------------------------------
    def step_begin(self) -> None:
        """Once per forward, before its first launch; a CUDA graph captures it."""
        self.ctl[P.CTL_EPOCH : P.CTL_EPOCH + 1].add_(1)

    def launch_args(self) -> dict[str, Any]:
        """What every protocol kernel takes: control words, health address (an int: it may
        be pinned host memory), scratch, ticket counters, and the interpreter switch."""
        return {"ctl": self.ctl, "health": self.health.data_ptr(), "scratch": self.scratch,
                "tickets": self.tickets, "CPU": self.cpu}

    def peer_args(self) -> dict[str, Any]:
        """Every rank's peer-buffer base address (the alarm head; data past PEER_HEAD)."""
        return {"peers": self.peer.addresses, "rank": self.rank, "world": self.world}

    def after_step(self) -> None:
        """Once per executed step, eagerly on every rank (also under graph replay).

        Normal case: one read of a host-visible word, no device sync. Raises MonoFault
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
        head, _, body = timeline(self.rank, self.health.tolist(), self.alarms.tolist(),
                                 self.unit).partition("\n")
        self._fault = MonoFault(head, body)
        return self._fault

    def reset(self) -> None:
        """Collective, no launch in flight: clear scratch, tickets, peer buffer (alarms
        included) and health, restart the tag era. Makes a faulted runner usable again."""
        self._rezero()
        self._fault = None

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
        if isinstance(deadline_ns, bool) or not isinstance(deadline_ns, int) or deadline_ns <= 0:
            raise ValueError(f"deadline_ns must be a positive int, got {deadline_ns!r}")
        self.deadline_ns = deadline_ns
        self.ctl[P.CTL_DEADLINE] = self._units(deadline_ns)

    def inject(self, rank: int | None, delay_ns: int = 0) -> None:
        """Fault injection: `rank` stalls `delay_ns` (or until an alarm) before its first
        peer store in every launch; None turns it off. Same call on every rank."""
        if rank is not None and not 0 <= rank < self.world:
            raise ValueError(f"inject: rank {rank} not in [0, {self.world})")
        self.ctl[P.CTL_FAULT_RANK] = 0 if rank is None else rank + 1
        self.ctl[P.CTL_FAULT_DELAY] = self._units(delay_ns) if delay_ns > 0 else 0

    def skip_steps(self, n: int) -> None:
        """Advance the epoch by n steps as if n empty steps had run (tests of the tag era
        and its rezero start near the era's end with it)."""
        self.ctl[P.CTL_EPOCH : P.CTL_EPOCH + 1].add_(n)
        self._steps += n

    def tag(self, slot: int) -> int:
        """The tag a launch of `slot` would use now (host mirror of `step_tag`; syncs)."""
        epoch, base = self.ctl[: 2].tolist()
        return P.tag_of(epoch, base, slot)

    # -- device-side check ----------------------------------------------------------------
    def guard(self, x: torch.Tensor) -> None:
        """Fill floating `x` with NaN on the device when any alarm word at this rank's
        head is set; graph-capturable (a one-program launch). Call it after the layer
        loop so a step in which some rank gave up yields no finite logits."""
        from .guard import guard_nan

        guard_nan(x, self.peer.addresses, self.rank, self.world)

    def close(self) -> None:
        """Idempotent; frees the peer buffer."""
        self.peer.close()

    def __enter__(self) -> MonoRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
