"""PROVISIONAL device sync for the FFN kernel until mono_runtime's Triton helpers land.

Same words as mono_runtime.protocol (pairs: tag high, payload low; ctl words; health
counter); to be replaced by mono_runtime's helpers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mono_runtime import protocol as P

CTL_EPOCH: tl.constexpr = P.CTL_EPOCH
CTL_ERA_BASE: tl.constexpr = P.CTL_ERA_BASE
CTL_DEADLINE: tl.constexpr = P.CTL_DEADLINE
CTL_FAULT_RANK: tl.constexpr = P.CTL_FAULT_RANK
CTL_FAULT_DELAY: tl.constexpr = P.CTL_FAULT_DELAY
SLOT_BITS: tl.constexpr = P.SLOT_BITS
PEER_HEAD: tl.constexpr = P.PEER_HEAD
H_GIVEUPS: tl.constexpr = P.H_GIVEUPS


@triton.jit
def step_tag(ctl, slot):
    rel = tl.load(ctl + CTL_EPOCH, volatile=True) - tl.load(ctl + CTL_ERA_BASE, volatile=True)
    return ((rel << SLOT_BITS) | slot).to(tl.int32)


@triton.jit
def peer_base(peers, r):
    return tl.load(peers + r) + PEER_HEAD


@triton.jit
def publish(addr, tag, payload, mask=None):
    word = (tag.to(tl.int64) << 32) | (payload.to(tl.int64) & 0xFFFFFFFF)
    tl.store(addr.to(tl.pointer_type(tl.int64)), word, mask=mask)


@triton.jit
def _now(INTERPRET: tl.constexpr):
    if INTERPRET:
        return 0
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)


@triton.jit
def poll(addr, tag, ctl, health, alarm_base, region, INTERPRET: tl.constexpr, mask):
    """Payloads (int32) of the pairs at `addr` once every tag equals `tag`; gives up past
    the deadline (polls under the interpreter, ns on a GPU) and counts it in health."""
    ptr = addr.to(tl.pointer_type(tl.int64))
    w = tl.load(ptr, mask=mask, other=0, volatile=True)
    bad = tl.max((((w >> 32).to(tl.int32) != tag) & mask).to(tl.int32))
    deadline = tl.load(ctl + CTL_DEADLINE)
    t0 = _now(INTERPRET)
    n = 0
    waiting = (bad != 0) & (tl.load(health + H_GIVEUPS, volatile=True) == 0)
    while waiting:
        w = tl.load(ptr, mask=mask, other=0, volatile=True)
        bad = tl.max((((w >> 32).to(tl.int32) != tag) & mask).to(tl.int32))
        n += 1
        if INTERPRET:
            late = n > deadline
        else:
            late = _now(INTERPRET) - t0 > deadline
        if (bad != 0) & late:
            tl.atomic_add(health + H_GIVEUPS, 1)
            tl.store(health + 1, region)
            tl.store(health + 2, tl.min(tl.where(mask, (w >> 32), 1 << 40)))
            tl.store(health + 3, tag)
        waiting = (bad != 0) & (~late) & (tl.load(health + H_GIVEUPS, volatile=True) == 0)
    return (w & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def flag_set(ptr, tag):
    tl.debug_barrier()
    tl.atomic_xchg(ptr, (tag.to(tl.int64) << 32) | 1, sem="release", scope="gpu")


@triton.jit
def flag_wait(ptr, N: tl.constexpr, N2: tl.constexpr, tag, ctl, health, alarm_base, region,
              INTERPRET: tl.constexpr):
    """Wait for N flags (N2: N rounded up to a power of two)."""
    i = tl.arange(0, N2)
    poll(ptr + i, tag, ctl, health, alarm_base, region, INTERPRET, mask=i < N)
    tl.debug_barrier()


@triton.jit
def stall_if_injected(ctl, rank):
    pass


@triton.jit
def ticket_exit(tickets, ctl, health, peers, alarm_base, rank, tag, P_HS, W: tl.constexpr,
                FINAL: tl.constexpr, INTERPRET: tl.constexpr):
    done = tl.atomic_add(tickets + 1, 1)
    if done == tl.num_programs(0) - 1:
        tl.store(tickets, 0)
        tl.store(tickets + 1, 0)
