"""The protocol's numbers, shared by the host half and the device helpers (see PROTOCOL.md).

Everything a kernel and the host must agree on lives here: the control words, the tag
arithmetic, the peer-buffer head with its alarm words, and the health record layout.
The Triton helpers import these as constexpr globals; the FlyDSL twin copies the numbers.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass

# -- Control words: one int64 device tensor per runner (`MonoRunner.ctl`). ---------------
CTL_EPOCH = 0  # bumped once per forward by step_begin (graph-capturable)
CTL_ERA_BASE = 1  # the epoch at the last rezero; tags count steps from here
CTL_DEADLINE = 2  # a wait's bound: ns on a GPU, polls under the CPU interpreter
CTL_FAULT_RANK = 3  # fault injection: rank + 1 of the rank that stalls, 0 = off
CTL_FAULT_DELAY = 4  # fault injection: the stall, in the deadline's unit
CTL_GIVEUPS = 5  # give-ups of this rank: the record claim counter (device atomics only)
CTL_WORDS = 8

# -- Tags: a pair is one int64 word, tag in the high 32 bits, payload in the low 32. ------
SLOT_BITS = 8
SLOTS = 1 << SLOT_BITS  # launches a step may tag apart (slot 0..255)
ERA_STEPS = (1 << (32 - SLOT_BITS)) - 1  # steps an era can tag: rel epoch 1..ERA_STEPS
TAG_INVALID = 0  # what a step outside its era publishes; zeroed memory, matches no poll
REZERO_EVERY = ERA_STEPS // 2  # after_step rezeroes (collectively) this often

# -- Peer buffer head: one int32 alarm word per rank, then the kernels' data. ------------
MAX_RANKS = 64
PEER_HEAD = 4 * MAX_RANKS  # bytes; kernels see the buffer from here on
ALARM_FOLLOWED = 1  # the rank gave up because another rank's alarm was set
ALARM_GAVE_UP = 2  # the rank gave up on its own (deadline or era)

# -- Health: int64 words of this rank, host-visible (pinned on CUDA). --------------------
H_GIVEUPS = 0  # k + 1 of the latest claimed record (plain store); > 0: this rank faulted
HEALTH_HEAD = 8
RECORD_WORDS = 8
RECORDS = 8
HEALTH_WORDS = HEALTH_HEAD + RECORDS * RECORD_WORDS
R_KIND, R_REGION, R_PAIR, R_WANTED, R_SEEN, R_PROGRAM, R_TIME, R_ALARMS = range(RECORD_WORDS)

KIND_DEADLINE = 1  # waited past the deadline
KIND_ALARM = 2  # stopped because some rank's alarm word was set
KIND_ERA = 3  # the step's tag was outside its era (a rezero was missed)
KIND_NAMES = {KIND_DEADLINE: "deadline", KIND_ALARM: "alarm", KIND_ERA: "era"}


POLL_BACKOFF_ENV = "MONO_POLL_BACKOFF_NS"
POLL_BACKOFF_MAX_NS = 100_000


def poll_backoff() -> tuple[int, int]:
    """(nap, spin): a wait sleeps `nap` ns between polls once it has waited `spin` ns, from
    MONO_POLL_BACKOFF_NS = "NAP" or "NAP:SPIN" (0, the default: it spins). A tuning knob,
    read when the kernels' module is imported: a program that spins shares the L2 with the
    hand-offs it waits for, and a decode step has many; `spin` lets the short waits of a
    chain spin while the long ones (a stage waiting out the whole routed stream) sleep."""
    raw = os.environ.get(POLL_BACKOFF_ENV, "0").strip() or "0"
    parts = raw.split(":")
    if len(parts) > 2 or not all(x.isdigit() and int(x) <= POLL_BACKOFF_MAX_NS for x in parts):
        raise ValueError(
            f"{POLL_BACKOFF_ENV}={raw!r}: expected NAP or NAP:SPIN, integers of nanoseconds "
            f"0 to {POLL_BACKOFF_MAX_NS}"
        )
    nap, spin = int(parts[0]), int(parts[1]) if len(parts) == 2 else 0
    return nap, spin if nap else 0


def cpu_interpreter() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


PUBLISH_ENV = "MONO_PUBLISH"
PUBLISH_WAYS = ("store", "xchg")


def publish_way() -> str:
    """How `publish_value` writes a pair word on NVIDIA, from MONO_PUBLISH: "store" (the
    default: a relaxed 64-bit store, as indivisible for an aligned word as an exchange and
    with no reply to wait for: the FFN's push items 2.2 -> 0.6 us at S = 1 on an H100) or
    "xchg" (a relaxed 64-bit exchange, as before stop 44). Read when the kernels' module is
    imported; AMD and the interpreter always exchange."""
    raw = os.environ.get(PUBLISH_ENV, "store").strip() or "store"
    if raw not in PUBLISH_WAYS:
        raise ValueError(f"{PUBLISH_ENV}={raw!r}: expected one of {', '.join(PUBLISH_WAYS)}")
    return raw


ACQUIRE_ENV = "MONO_ACQUIRE"
ACQUIRE_WAYS = ("atomic", "load")


def acquire_way() -> int:
    """How a wait acquires the done pairs it saw (the stores of the items that published
    them become visible), from MONO_ACQUIRE, as `ACQUIRE_WAYS`' index: "load" (the default:
    an acquire load a pair) or "atomic" (an acquire add of 0 a pair, a read-modify-write
    that every waiter of a stage makes on the same words). H100 (stop 50,
    `bench_protocol --fanouts`): a stage's hand-off to 131 waiters took 1.89 us by load,
    2.18 by add, 1.98 by one `fence.acq_rel.gpu` a thread (that way was removed). NVIDIA
    only; AMD and the interpreter add. Read when the kernels' module is imported."""
    raw = os.environ.get(ACQUIRE_ENV, "load").strip() or "load"
    if raw not in ACQUIRE_WAYS:
        raise ValueError(f"{ACQUIRE_ENV}={raw!r}: expected one of {', '.join(ACQUIRE_WAYS)}")
    return 0 if cpu_interpreter() else ACQUIRE_WAYS.index(raw)


def tag_of(epoch: int, base: int, slot: int) -> int:
    """The 32-bit tag of launch `slot` in the step at `epoch`, or TAG_INVALID outside the era.

    Mirrors the device helper `step_tag` exactly (tests compare the two)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} outside 0..{SLOTS - 1}")
    rel = epoch - base
    if not 1 <= rel <= ERA_STEPS:
        return TAG_INVALID
    return (rel << SLOT_BITS) | slot


@dataclass(frozen=True)
class Tag:
    """A decoded tag: the step (counted from the era's base, 1-based) and the launch slot."""

    step: int
    slot: int

    @property
    def valid(self) -> bool:
        return self.step > 0

    def __str__(self) -> str:
        return f"step {self.step} slot {self.slot}" if self.valid else "nothing (zeroed)"


def decode_tag(tag: int) -> Tag:
    tag &= 0xFFFFFFFF
    return Tag(tag >> SLOT_BITS, tag & (SLOTS - 1))


def pack_pair(tag: int, payload: int) -> int:
    """The int64 word of a pair (signed, as torch stores it)."""
    word = ((tag & 0xFFFFFFFF) << 32) | (payload & 0xFFFFFFFF)
    return word - (1 << 64) if word >= 1 << 63 else word


def unpack_pair(word: int) -> tuple[int, int]:
    """(tag, payload) of an int64 pair word, both unsigned 32-bit."""
    word &= (1 << 64) - 1
    return word >> 32, word & 0xFFFFFFFF


Describe = Callable[[int], tuple[str, "int | None"]]
_REGIONS: dict[int, tuple[str, Describe | None]] = {}


def region_id(name: str, describe: Describe | None = None) -> int:
    """A stable id (31 bits, never 0) a kernel passes to its polls; the timeline names it.

    A hash, so every rank and process derives the same id without registration.
    `describe(pair)` -> (where the pair is, e.g. "from rank 1, row 0"; the writing rank or
    None) lets the timeline say who never arrived."""
    rid = zlib.crc32(name.encode()) & 0x7FFFFFFF or 1
    if describe is not None or rid not in _REGIONS:
        _REGIONS[rid] = (name, describe)
    return rid


def region_name(rid: int) -> str:
    return _REGIONS[rid][0] if rid in _REGIONS else f"region {rid:#x}"


def describe_pair(rid: int, pair: int) -> tuple[str, int | None]:
    """(where pair `pair` of region `rid` is, its writer rank or None)."""
    entry = _REGIONS.get(rid)
    if entry is None or entry[1] is None:
        return f"pair {pair}", None
    where, writer = entry[1](pair)
    return f"pair {pair} ({where})", writer
