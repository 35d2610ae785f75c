"""The FFN monokernel's contract: build key, task plan, scratch and peer layouts, arguments.

Every build (Triton here, FlyDSL in flydsl_build.py) implements this spec; the runner and
the tests read only this module. Pure Python: a CPU can check every layout.

One launch, one TP rank, S = 1..16 rows (a decode step), does in this order of tasks
(tickets, `stages` below; a task waits only on tasks of smaller tickets or on peers'
pushes, so the launch finishes at any residency):

    push    PUSH tasks   this rank's unreduced o_proj partial, bf16 pairs -> every rank's
                         peer region `ar1[src = this rank]`
    seam    S x NCH      row s, one column chunk: the ranks' pairs summed in rank order
                         (fp32 -> bf16), + residual in fp32 -> `residual_out` (bf16), `xs`,
                         and the chunk's sum of squares
    norm    S x NCH      row s, one column chunk: Gemma RMSNorm over the row's sums -> `xn`
    router  RG x RP      16 experts x one K part of the fp32 router GEMV -> `logit[p, s, e]`,
                         normalising its own K part from `xs` (it waits for the seam, not
                         the norm: one hand-off less before the route); with no route stage
                         (tile rr = 0) the last router item to finish (a self-resetting
                         counter) routes every row, then waits for the norm items before
                         marking the route done (the routed up items read `xn` and wait
                         only for the route)
    route   ceil(S / rr) rows [q rr, (q + 1) rr) (tile rr > 0: wide steps, where one
                         program's route of every row was the critical path): after every
                         router item, their top-k -> `topk_ids`, `topk_w`; the last route
                         item to finish builds the slot table from them, then waits for the
                         norm items and marks the route done:
            (route)      parts summed in order, sigmoid, + bias, top-k (ties -> lower id, NaN
                         last), weights renormalized x routed_scaling_factor; the slot table:
                         slot 0 = the shared expert (id E), slots 1.. = the union of the live
                         rows' experts in ascending id; `wtab[slot, s]` the row's weight (0 when
                         the row does not use it; padding rows use none). ROUTED builds have no
                         shared slot, SHARED builds only it.
    shared  NC x UKS0    the shared expert's up items (no routing needed), as `up`: before
                         the routed ones (tile `sfirst`: they stream while the router routes)
                         or after them (the routed up items then take the programs free when
                         the route lands)
    sdown   ND           DC output columns of the shared expert's down, once its up items
                         are done: right after them, so that no shared item waits for the
                         route (the routed down items add their groups to its part)
    up      routed slots x NC x UKS  slot j, BN gate + BN up rows of w13, one K part; the
                         last part of a row block sums the parts in order, applies SwiGLU-OAI
                         -> bf16 `mid[j, s, :]` (dynamic: tickets past the routed slots'
                         belong to the next stages)
    down    ND x NG      DC output columns over routed slot group q, each slot as soon as
                         its up items are done, weighted by `wtab`; the last of a column
                         block's parts (the sdown item and the NG groups) sums them in order
                         (shared first), rounds to bf16 -> every rank's `ar2[src = this rank]`
    final   S x NF       row s, FC columns: the ranks' partials in rank order -> `out` (bf16)
    hs      1 task       final launches only: after every final task, a pair to every rank's
                         `hs[this rank]`, then a poll of its own `hs[0..tp)`: a rank that gave
                         up anywhere in the step has set its alarm here, so every rank records
                         a give-up in the same step

Tasks that others wait on (seam, norm, router items when a route stage follows, final)
mark `done[t]` = (tag, 1) with mono_runtime's `ticket_finish`; the up items of a slot
count themselves and the last marks that slot's done pair (past the tickets), the item
that builds the slot table the route's; a waiter polls the done pairs it needs (all set
by smaller tickets) and then acquires them. Tickets
come from the runtime's per-slot counter (`tickets[slot]`); programs that drew before the
route's slot count was known learn it, and the launch's last taker resets the counter.

Peer regions are sized for 16 rows so that every width shares them; one buffer suffices
(no parity): a rank cannot push launch n+1's `ar1` before every peer finished reading launch
n's, because its launch n ended only after every peer's `ar2` push, which each peer makes
after its own seam. Mailbox pairs are int64 words (32-bit payload, 32-bit tag) written and
polled only through mono_runtime's device helpers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from mono_runtime.kernel.tiles import tile_overrides
from mono_runtime.stream.experts import FP8_FRAG, FRAG
from mono_runtime.timeline import stamp_bytes

from ..config import MiniMaxM3Config
from ..formats import FP8_BLOCK, WeightFormat

MAX_ROWS = 16
DOT_ROWS = 16  # rows of every tl.dot tile (the M operand); live rows are masked
PAIR = 8  # bytes of a mailbox pair
ALIGN = 256


class Experts(str, enum.Enum):
    """Which expert terms a build sums: ALL in production; one side alone to qualify it."""

    ALL = "all"
    ROUTED = "routed"
    SHARED = "shared"


@dataclass(frozen=True)
class FfnBuild:
    """A compiled variant. `cfg` carries every model constant the kernel bakes in."""

    cfg: MiniMaxM3Config
    rows: int
    tp: int
    weights: WeightFormat = WeightFormat.MXFP4
    experts: Experts = Experts.ALL
    timeline: bool = False
    packed: bool = True  # MXFP4: stream mxfp4-rot (False: the checkpoint's mxfp4-k32)
    # the Gluon build: packed MXFP4 experts in mxfp4-frag (not -rot), or FP8 experts and
    # shared expert in fp8-frag
    frag: bool = False

    def __post_init__(self):
        c = self.cfg
        if not 1 <= self.rows <= MAX_ROWS:
            raise ValueError(f"rows={self.rows}: the kernel serves 1..{MAX_ROWS} rows")
        if self.tp not in (1, 2, 4, 8):
            raise ValueError(f"tp={self.tp}: expected 1, 2, 4 or 8")
        if not isinstance(self.weights, WeightFormat):
            raise ValueError(f"weights={self.weights!r}: expected a WeightFormat")
        if not isinstance(self.experts, Experts):
            raise ValueError(f"experts={self.experts!r}: expected an Experts value")
        i = c.per_rank_intermediate(self.tp)
        if c.per_rank_shared_intermediate(self.tp) != i:
            raise ValueError("the shared expert's per-rank width must equal a routed expert's")
        if c.num_experts % 16:
            raise ValueError(f"num_experts={c.num_experts}: must be a multiple of 16")
        if c.hidden_size % 256:
            raise ValueError(f"hidden_size={c.hidden_size}: must be a multiple of 256")
        if self.weights is WeightFormat.FP8 and i % FP8_BLOCK:
            raise ValueError(f"fp8 experts need 128-aligned shards; per-rank I = {i}")
        if self.frag and not (
            (self.weights is WeightFormat.MXFP4 and self.packed) or self.weights is WeightFormat.FP8
        ):
            raise ValueError("frag: the Gluon build streams packed MXFP4 or FP8 experts only")

    # -- plan ---------------------------------------------------------------------------
    @property
    def layout(self) -> str:
        if self.frag:
            return FP8_FRAG if self.weights is WeightFormat.FP8 else FRAG
        return "mxfp4-rot" if self.rot else self.weights.layout

    @property
    def inter(self) -> int:
        return self.cfg.per_rank_intermediate(self.tp)

    @property
    def max_slots(self) -> int:
        """Shared expert + the widest possible union of routed experts."""
        return 1 + min(self.rows * self.cfg.top_k, self.cfg.num_experts)

    @property
    def max_routed(self) -> int:
        """The most routed slots a step can have (the down stage's groups share them; the
        shared expert's down items are a stage of their own); 1 for a SHARED build."""
        return max(1, self.max_slots - (self.experts is not Experts.ROUTED))

    @cached_property
    def plan(self) -> TaskPlan:
        """Computed once a build: its tile overrides are read at the first use, not again
        at every launch that asks for the build's constexprs."""
        return TaskPlan.of(self)

    @property
    def rot(self) -> bool:
        """Whether the build streams MXFP4 experts in the packed ``mxfp4-rot`` layout."""
        return self.weights is WeightFormat.MXFP4 and self.packed and not self.frag

    def key(self) -> tuple:
        c = self.cfg
        return (
            "ffn",
            self.rows,
            self.tp,
            self.layout,
            self.experts.value,
            self.timeline,
            self.packed,
            c.hidden_size,
            c.num_experts,
            c.top_k,
            self.inter,
            c.routed_scaling_factor,
            c.swiglu_alpha,
            c.swiglu_beta,
            c.swiglu_limit,
            c.rms_norm_eps,
        )


@dataclass(frozen=True)
class TaskPlan:
    """Item counts and tiles. The expert stages stream weights with mono_runtime.stream:
    an up item is BN gate + BN up rows of one slot over one of its K parts (the shared
    expert's parts UKS0, a routed expert's UKS: split-K keeps >= 2.5 items per SM at S = 1);
    a down item is DC output rows over one group of slots (NG groups, so many slots make
    long items and few slots many). Split parts are summed in a fixed order by the item
    that finishes last, so results do not depend on timing."""

    push: int
    push_cols: int
    seam_cols: int
    router_groups: int  # RG: 16 experts each
    router_parts: int  # RP: K parts of the router GEMV
    router_k: int  # columns of one part
    bn: int  # gate (and up) rows of one up item
    nc: int  # up row blocks per slot
    ubk: int  # K step of a routed expert's up stream
    uks: int  # K parts of a routed expert's up rows
    ubk0: int  # K step of the shared expert's up stream
    uks0: int  # K parts of the shared expert's up rows
    dc: int  # output rows of a down item
    down: int  # ND: column blocks of the down stage
    dbk: int  # K step of a routed expert's down stream
    dbk0: int  # K step of the shared expert's down stream
    ng: int  # slot groups of the down stage
    final: int
    fc: int
    stages: int  # software-pipeline depth of every weight stream but the two below
    # the routed up and down items' ring depth (0: stages): not the kernel's largest rings
    # (the shared expert's bf16 one is), so deeper ones cost no shared memory (sm_90
    # compile: 110,592 B at S = 1..4 with 6 up stages) yet keep more bytes in flight
    ust: int
    dst: int
    warps: int  # warps of a program: 4 (one warpgroup) or 8 (two warps per scheduler)
    occ: int  # programs per SM the runner launches (2 fits with stages <= 3 at 4 warps)
    regs: int  # cap on a thread's registers (ptxas maxnreg; 0: the compiler's choice)
    # an up item's gate and up rows in one loop (stream_row_pair): 1 two dots, 2 one tile,
    # 3 one tile and, in the Gluon build, one ring (`frag_stream_row_pair`; Gluon runs 1
    # and 2 as two rings one after the other)
    pair: int
    rrows: int  # S at most this: the router dots one row at a time, else on tensor cores
    upf: int  # 1: a routed up item asks L2 for its rows before streaming them
    # 1: a shared up item asks L2 for its rows before waiting for the norm, a shared down
    # item for its rows before waiting for the up items (they come while the seam lands,
    # competing with the seam's own loads), 0: not at all
    spf: int
    # 1: a down item asks L2 for a slot's rows before waiting for the slot; 2: for every
    # slot of its group before the first wait
    dpf: int
    # 1: the Gluon build's MXFP4 down item streams its group's slots in one ring
    # (`frag_stream_experts`), after one wait for all of them; 0: one stream a slot
    dring: int
    sfirst: int  # 1: the shared expert's up items take tickets before the routed ones, 0 after
    rt: int  # the route's tiles hold max(rt, S rounded up to a power of two) rows
    # rows a route item picks the experts of (a stage of ceil(S / rr) items after the
    # router's; the last to finish builds the slot table); 0: the last router item to
    # finish routes every row itself
    rr: int

    @classmethod
    def of(cls, b: FfnBuild) -> TaskPlan:
        h, i, s = b.cfg.hidden_size, b.inter, b.rows
        push_cols = min(h, 512)
        rp = 16 if h % (16 * 128) == 0 else 1
        big = h >= 2048  # real shapes: tiles for bandwidth; tiny ones: every path exercised
        fp8 = b.weights is WeightFormat.FP8
        shared_fp8 = b.weights.shared_format is WeightFormat.FP8
        # gate and up rows of an up item in one loop (one ramp): 89.1 / 343.2 us at S = 1 / 16
        # against 92.4 / 362.1 one after the other (H200, ffn.tune, one run). As one tile of
        # 128 rows (pair 2: one dot a K step, and ptxas keeps the wgmma pipelined) or as two
        # dots (1: ptxas then serializes every wgmma of the kernel, C7515): H200 (stop 33,
        # `mono bench ffn`, against stop 27's) one tile 66.5 / 92.6 / 124.1 / 216.1 / 334.4
        # us at S = 1 / 2 / 4 / 8 / 16, two dots 71.3 / 101.1 / 129.8 / 195.0 / 299.0.
        # Tiny builds the same, so that the interpreter runs both
        pair = 2 if s <= 4 else 1
        # The Gluon build at S > 4: gate and up in one ring, 128 down rows an item, 16 slot
        # groups; H200 (stop 38, ffn.tune, 12 layers, same call) 125.9 / 216.5 us at
        # S = 8 / 16 against 146.7 / 241.2 with the Triton build's tiles (one ring alone
        # 137.1 / 232.7; at S = 1 / 4 it changes nothing: 48.1 / 89.8 against 47.1 / 90.2)
        gluon_wide = b.frag and s > 4
        if big:
            tiles = dict(
                bn=64,
                ubk=128 if fp8 else 256,
                uks=4 if s == 1 else 2 if s <= 4 else 1,
                ubk0=128,
                uks0=8,
                # down columns of an item: 64 rows at S > 4 (a [64, BK] decoded tile: half
                # the registers); H200 (ffn.tune, 2 runs, mxfp4): 305.8 / 304.6 us at
                # S = 16 against 312.2 / 312.8 with 128 rows, 74.3 / 73.8 against 72.7 / 73.4
                # at S = 1. FP8 keeps 128 (not measured)
                dc=128 if s <= 4 or fp8 or gluon_wide else 64,
                dbk=_step(i, 128 if fp8 else 256),
                dbk0=_step(i, 128),
                # (groups of routed slots: at S = 1 four, one expert each)
                ng=min(b.max_routed, 16 if gluon_wide else 8),
                # two programs an SM, 3 stages each (110 KB of shared memory): twice the
                # loads in flight of one 4-stage program; on the H200 (ffn.tune, same run)
                # 103.9 / 475.5 us at S = 1 / 16 against 117.8 / 588.0 (8 warps: 129.5 / 666.6)
                stages=3,
                # the Gluon MXFP4 build's routed up items at S <= 4 in a 6-deep ring (the
                # whole K part of 6 steps in flight at S = 1): H100 (stop 42, ffn.tune, same
                # call) 47.2 / 68.4 / 95.0 us at S = 1 / 2 / 4 against 49.3 / 69.3 / 97.7;
                # ust=4,dst=4 at S = 8 / 16 136.4 / 199.8 against 135.9 / 199.8, FP8 (Gluon)
                # 53.0-299.5 against 54.1-300.8 (within noise: not taken)
                ust=6 if b.frag and not fp8 and s <= 4 else 0,
                dst=0,
                warps=4,
                occ=2,
                # no register cap: 255 (1 KB of spills, 5 reloads a trip of the paired up
                # loop); a cap of 168 spills 1.6 KB, 6-7 reloads a trip (sm_90 compile),
                # room for 3 programs an SM if their shared memory fits
                regs=0,
                pair=3 if gluon_wide else pair,
                # the router item alone on the H200 (16 experts x 384 columns): one row at
                # a time 1.2 / 4.7 / 19 us at S = 1 / 4 / 16; an fp32 FMA dot 8 us at any S
                # (its K steps one serial chain; ~20 us an item inside the FFN at S = 16)
                rrows=4,
                upf=0,
                # no early prefetch of the shared expert at S <= 4: H100 (stop 41, ffn.tune,
                # same call) 49.3 / 68.3 / 97.5 us at S = 1 / 2 / 4 against 50.3 / 70.4 /
                # 99.9 (stop 40: 246.3 against 243.1 at S = 16)
                spf=0 if s <= 4 else 1,
                dpf=1,
                # a down item's slots in one ring (Gluon, MXFP4) at S > 4, where a group holds
                # several: H100 (stop 41, ffn.tune, same call) 135.9 / 202.8 us at S = 8 / 16
                # against 139.8 / 212.7 (dpf=2 alone: 139.4 / 216.3). At S <= 4 a group is
                # one slot and the ring has nothing to overlap
                dring=1 if gluon_wide else 0,
                # the shared expert's up items before the routed ones: after them (0), the
                # routed up items take the programs free when the route lands, yet H200
                # (stop 34, ffn.tune, same call) 68.6 / 94.6 us at S = 1 / 2 against 65.5 /
                # 90.6 first
                sfirst=1,
                # the route's tiles of 4 rows at S = 1 and 2 (one row a warp: its reductions
                # over the experts stay in a warp; 73 -> 31 barriers at S = 1): H200 (stop
                # 34, ffn.tune, same call) 63.5 / 90.2 us against 66.0 / 91.7 with 2 rows
                rt=4,
                # rr=4 at S > 4 (the route in S / 4 items): H100 (stop 40, ffn.tune, same
                # call; the router's old FMA dot on two chains) 136.2 / 226.9 us at S = 8 /
                # 16 against 137.4 / 243.1; at S = 1 a hand-off more: 53.1 against 50.7
                rr=4 if gluon_wide else 0,
            )
            tiles = tile_overrides(TILES_ENV, tiles)  # a real-shape build's, for tuning
        else:
            tiles = dict(
                bn=min(32, i),
                ubk=128 if fp8 else 64,
                uks=2,
                ubk0=128 if shared_fp8 else 64,
                uks0=2,
                dc=64,
                dbk=128 if fp8 else min(64, i),
                dbk0=128 if shared_fp8 else min(64, i),
                ng=min(b.max_routed, 2),
                stages=2,
                ust=3,
                dst=0,
                warps=4,
                occ=1,
                regs=0,
                pair=pair,
                rrows=4,
                upf=0,
                spf=1,
                dpf=2 if s > 4 else 1,  # (nothing under the interpreter: its loop runs)
                dring=1,  # (Gluon only: the interpreter runs the Triton body)
                sfirst=0 if s <= 4 else 1,  # the interpreter runs both orders
                rt=4,
                rr=2 if s > 4 else 0,  # both routes too
            )
        _check_tiles(b, tiles)
        fc = min(h, 256)
        return cls(
            push=h // push_cols,
            push_cols=push_cols,
            seam_cols=min(h, 1024),
            router_groups=b.cfg.num_experts // 16,
            router_parts=rp,
            router_k=h // rp,
            nc=i // tiles["bn"],
            down=h // tiles["dc"],
            final=h // fc,
            fc=fc,
            **tiles,
        )

    @property
    def seam_chunks(self) -> int:
        """Column chunks of a row's seam (and of its norm)."""
        return self.push * self.push_cols // self.seam_cols


def _step(k: int, want: int) -> int:
    """The largest power-of-two K step <= `want` that divides K (I per rank is 768 at TP 4
    but 384 at TP 8)."""
    while k % want:
        want //= 2
    return want


TILES_ENV = "MONO_FFN_TILES"


def _check_tiles(b: FfnBuild, t: dict[str, int]) -> None:
    """Every tile divides what it walks, and the formats' limits hold (fp8: inside one
    128 x 128 scale block, or two in the Gluon build; mxfp4: K steps of >= 32)."""
    h, i = b.cfg.hidden_size, b.inter
    fp8 = b.weights is WeightFormat.FP8
    sfp8 = b.weights.shared_format is WeightFormat.FP8

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"FFN tiles {t}: {what}")

    def pow2(n: int) -> bool:
        return n > 0 and not n & (n - 1)

    for name in t:
        need(
            pow2(t[name])
            or name
            in (
                "ng",
                "stages",
                "ust",
                "dst",
                "pair",
                "upf",
                "spf",
                "dpf",
                "sfirst",
                "dring",
                "occ",
                "regs",
                "rr",
                "rrows",
            ),
            f"{name} must be a power of two",
        )
    need(0 <= t["ust"] <= 8 and 0 <= t["dst"] <= 8, "ust and dst are 0..8")
    need(t["stages"] >= 1 and 1 <= t["ng"] <= b.max_slots, "stages >= 1, 1 <= ng <= max_slots")
    need(t["warps"] in (4, 8), "warps is 4 or 8")
    need(t["occ"] in (1, 2, 3), "occ is 1, 2 or 3")
    need(
        t["regs"] == 0 or (64 <= t["regs"] <= 255 and t["regs"] % 8 == 0),
        "regs is 0 or 64..255, a multiple of 8",
    )
    need(t["pair"] in (0, 1, 2, 3), "pair is 0, 1, 2 or 3")
    need(
        t["pair"] != 3 or not b.frag or t["bn"] >= 16 * t["warps"],
        "pair 3 (the Gluon build's one-ring pair) needs bn >= 16 x warps",
    )
    need(
        all(t[k] in (0, 1) for k in ("upf", "spf", "sfirst", "dring")),
        "upf, spf, sfirst and dring are 0 or 1",
    )
    need(t["dpf"] in (0, 1, 2), "dpf is 0, 1 or 2")
    need(
        t["rrows"] <= 16 and (t["rrows"] == 0 or pow2(t["rrows"])),
        "rrows is 0 or 1..16, a power of two",
    )
    need(t["rr"] == 0 or (pow2(t["rr"]) and t["rr"] <= 16), "rr is 0 or a power of two <= 16")
    need(i % t["bn"] == 0 and t["bn"] >= 16, f"bn must divide I = {i}, >= 16")
    need(h % t["dc"] == 0 and t["dc"] >= 16, f"dc must divide H = {h}, >= 16")
    for bk, ks, k, f8 in (
        ("ubk", "uks", h, fp8),
        ("ubk0", "uks0", h, sfp8),
        ("dbk", None, i, fp8),
        ("dbk0", None, i, sfp8),
    ):
        parts = t[ks] if ks else 1
        need(t[bk] >= 32 and k % (t[bk] * parts) == 0, f"{bk} x parts must divide K = {k}")
        if f8:  # the Gluon ring scales each half step: its steps may span two blocks
            top = 2 * FP8_BLOCK if b.frag else FP8_BLOCK
            need(t[bk] <= top, f"{bk} <= {top} for fp8 in this build")
    if fp8 or sfp8:
        need(t["bn"] <= FP8_BLOCK and t["dc"] <= FP8_BLOCK, "bn, dc <= 128 for fp8")


# -- layouts ---------------------------------------------------------------------------


def _layout(items: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    out, off = {}, 0
    for name, nbytes in items:
        out[name] = (off, nbytes)
        off += -(-nbytes // ALIGN) * ALIGN
    return out


def route_items(b: FfnBuild) -> int:
    """Items of the route stage (tile rr; none when the last router item routes)."""
    rr = b.plan.rr
    return -(-b.rows // rr) if rr else 0


def stages(b: FfnBuild, nslots: int, final: bool) -> list[tuple[str, int]]:
    """(stage, items) in ticket order of a launch that routed `nslots` slots (shared
    included): the one statement of the ticket order the kernel follows."""
    p, s = b.plan, b.rows
    shared = b.experts is not Experts.ROUTED
    own = [("shared-up", p.nc * p.uks0 if shared else 0), ("shared-down", p.down * shared)]
    routed = [("up", (nslots - shared) * p.nc * p.uks)]
    return [
        ("push", p.push),
        ("seam", s * p.seam_chunks),
        ("norm", s * p.seam_chunks),
        ("router", p.router_groups * p.router_parts),
        ("route", route_items(b)),
        *(own + routed if p.sfirst else routed + own),
        ("down", p.down * p.ng),
        ("final", s * p.final),
        ("handshake", int(final)),
    ]


# Each stage's inputs by stage (`mono_runtime.timeline.stage_deps`): the stages whose done
# pairs (`waits`; a slot's pair stands for its up items, the route's for the router or
# route items that built the table) or pushes (the seam's and final's polls) its items
# wait for.
INPUTS = {
    "seam": ("push",),
    "norm": ("seam",),
    "router": ("seam", "norm"),  # (the last router item, where it builds the table)
    "route": ("router", "norm"),
    "shared-up": ("norm",),
    "up": ("router", "route", "norm"),
    "shared-down": ("shared-up",),
    "down": ("shared-up", "up"),
    "final": ("shared-down", "down"),
    "handshake": ("final",),
}


def stage_bounds(b: FfnBuild, nslots: int, final: bool) -> list[tuple[str, int, int]]:
    """(stage, first ticket, end ticket) of a launch of `b` that routed `nslots` slots."""
    out, t = [], 0
    for name, n in stages(b, nslots, final):
        out.append((name, t, t + n))
        t += n
    return out


def slot_done(b: FfnBuild, j: int) -> int:
    """The done pair of slot j: set once every up item of the slot finished."""
    return max_tickets(b) + j


def route_done(b: FfnBuild) -> int:
    """The route's done pair: set by the item that builds the slot table, once the norm is
    done."""
    return max_tickets(b) + b.max_slots


def waits(b: FfnBuild, nslots: int, final: bool) -> dict[int, list[int]]:
    """Ticket -> the done pairs its item waits for (ticket t's pair is t; `slot_done`,
    `route_done`), in a launch that routed `nslots` slots; peers' pushes are not done
    pairs. The item that builds the slot table (the last router item, or the last route
    item, to finish) is whichever finishes last: listed as the last in ticket order. Not
    listed: before its first ticket past the static tasks, a program learns the slot count
    from the route's pair (once). The Triton build's plan (the FlyDSL build still runs the
    first one: its README)."""
    p, s = b.plan, b.rows
    at = {name: range(lo, hi) for name, lo, hi in stage_bounds(b, nslots, final)}
    nch = p.seam_chunks
    seam, norm = list(at["seam"]), list(at["norm"])
    out: dict[int, list[int]] = {}
    for r in range(s):
        for ch in range(nch):
            out[norm[r * nch + ch]] = seam[r * nch : (r + 1) * nch]
    for t in at["router"]:
        out[t] = seam
    router = list(at["router"])
    if at["route"]:  # route items wait for every router item; the last also for the norm
        for t in at["route"]:
            out[t] = router
        out[at["route"][-1]] = router + norm
    else:
        out[router[-1]] = seam + norm
    for t in at["shared-up"]:
        out[t] = norm
    for t in at["shared-down"]:
        out[t] = [slot_done(b, 0)]
    first = int(b.experts is not Experts.ROUTED)  # the down groups share the routed slots
    per = -(-(nslots - first) // p.ng)
    for i, t in enumerate(at["down"]):
        q = i % p.ng
        j0, j1 = min(first + q * per, nslots), min(first + (q + 1) * per, nslots)
        if j1 > j0:
            out[t] = [slot_done(b, j) for j in range(j0, j1)]
    for t in at["handshake"]:
        out[t] = list(at["final"])
    return out


def down_parts(b: FfnBuild) -> int:
    """Partials of a down column block, summed in this order: the shared expert's (its
    sdown item), then each routed slot group's."""
    return b.plan.ng + (b.experts is not Experts.ROUTED)


def max_tickets(b: FfnBuild) -> int:
    """Tickets of the widest launch: every slot routed, ending in the handshake."""
    return sum(n for _, n in stages(b, b.max_slots, final=True))


def scratch_layout(b: FfnBuild) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region of one width's scratch (this rank only).

    done   pairs[max_tickets + max_slots + 1]: item t's (tag, 1) once ticket t's task
           finished; then one per slot, once every up item of that slot finished; then
           the route's, once the last router item routed
    count  int32 counters, each reset by the item that brings it to its end:
           ucount[max_slots * NC] K parts finished per (slot, row block),
           scount[max_slots] row blocks finished per slot, dcount[ND] groups finished per
           down column block (and its shared part), rcount[1] router items (or route
           items) finished
    xs     fp32[S, H]   the seam's new residual in fp32 (seam items -> norm, router items)
    ssq    fp32[S, seam chunks]  each seam item's sum of squares
    xn     bf16[16, H]  the normed MoE input (rows >= S never read unmasked)
    logit  fp32[RP, S, E]
    table  int32 nslots, int32 slot_expert[max_slots], fp32 wtab[max_slots, S],
           int32 topk_ids[S, K], fp32 topk_w[S, K]
    mid    bf16[max_slots, S, I]
    upart  fp32 up partials: [NC, UKS0, 2, BN, S] of the shared expert, then
           [routed slots, NC, UKS, 2, BN, S] (none when UKS = 1)
    dpart  fp32 down partials [ND, parts, DC, S]: the shared expert's (unless ROUTED),
           then the NG groups' of routed slots
    timeline  int64[max_tickets, 6] (timeline builds only): each item's program and SM, ticket,
           start, ready, end and mark (device clock, ns)
    """
    c, p, s = b.cfg, b.plan, b.rows
    h, e, k = c.hidden_size, c.num_experts, c.top_k
    table = 4 + 4 * b.max_slots + 4 * b.max_slots * s + 8 * s * k
    counters = 4 * (b.max_slots * p.nc + b.max_slots + p.down + 1)
    block = 4 * 2 * p.bn * s  # one (gate, up) partial
    routed = b.max_slots - (0 if b.experts is Experts.ROUTED else 1)
    upart = block * p.nc * (p.uks0 + (routed * p.uks if p.uks > 1 else 0))
    return _layout(
        [
            ("done", PAIR * (max_tickets(b) + b.max_slots + 1)),
            ("count", counters),
            ("xs", 4 * s * h),
            ("ssq", 4 * s * p.seam_chunks),
            ("xn", 2 * DOT_ROWS * h),
            ("logit", 4 * p.router_parts * s * e),
            ("table", table),
            ("mid", 2 * b.max_slots * s * b.inter),
            ("upart", upart),
            ("dpart", 4 * p.down * down_parts(b) * p.dc * s),
        ]
        + ([("timeline", stamp_bytes(max_tickets(b)))] if b.timeline else [])
    )


def table_offsets(b: FfnBuild) -> dict[str, int]:
    """Byte offsets inside the `table` region."""
    s, k, m = b.rows, b.cfg.top_k, b.max_slots
    wtab = 4 + 4 * m
    ids = wtab + 4 * m * s
    return {"nslots": 0, "slot_expert": 4, "wtab": wtab, "topk_ids": ids, "topk_w": ids + 4 * s * k}


def scratch_bytes(b: FfnBuild) -> int:
    off, n = list(scratch_layout(b).values())[-1]
    return off + -(-n // ALIGN) * ALIGN


def peer_layout(cfg: MiniMaxM3Config, tp: int) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region in a rank's peer buffer past mono_runtime's head.

    ar1  pairs[tp src][16 rows][H / 2]: bf16 pairs of the attention partials
    ar2  pairs[tp src][16 rows][H / 2]: bf16 pairs of the MoE partials
    hs   pairs[tp]: the step-end fault handshake (final launches)
    """
    row = PAIR * (cfg.hidden_size // 2)
    return _layout(
        [
            ("ar1", tp * MAX_ROWS * row),
            ("ar2", tp * MAX_ROWS * row),
            ("hs", PAIR * tp),
        ]
    )


def peer_bytes(cfg: MiniMaxM3Config, tp: int) -> int:
    off, n = list(peer_layout(cfg, tp).values())[-1]
    return off + -(-n // ALIGN) * ALIGN


# -- arguments ---------------------------------------------------------------------------

# The launch's runtime arguments, in order, before mono_runtime's own (launch_args(), then
# peer_args()). Names match the Triton kernel's parameters; the runner checks both.
ARGS: tuple[tuple[str, str], ...] = (
    ("part", "bf16[S, H] this rank's unreduced o_proj output"),
    ("residual", "bf16[S, H] the residual stream in"),
    ("out", "bf16[S, H] the all-reduced MoE output"),
    ("residual_out", "bf16[S, H] the new residual (may alias residual)"),
    ("slots", "int64[S] the rows' KV slots: negative = graph padding"),
    ("norm", "bf16[H] post_attention_layernorm weight"),
    ("router", "fp32[E, H]"),
    ("bias", "fp32[E] e_score_correction_bias"),
    ("w13", "experts gate|up, layout per build"),
    ("w13_scale", "its scales (any tensor for bf16)"),
    ("w2", "experts down"),
    ("w2_scale", "its scales"),
    ("sw13", "shared gate|up, layout weights.shared_format"),
    ("sw13_scale", "its scales"),
    ("sw2", "shared down"),
    ("sw2_scale", "its scales"),
    ("scratch", "uint8 this width's scratch region (scratch_layout)"),
    ("slot", "int32 the launch's tag slot in its step (0..255; also its ticket counter)"),
    ("final", "int32 1: the launch ends in the TP fault handshake"),
)
"""Then mono_runtime's: ctl, health, tickets (MonoRunner.launch_args()), peers, rank, world
(peer_args()). bf16 tensors (part, residual, out, residual_out, norm) are passed as int32
views: bf16 pairs, column 2j in the low half, exactly a mailbox payload."""
