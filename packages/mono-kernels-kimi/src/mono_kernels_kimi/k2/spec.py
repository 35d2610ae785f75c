"""K2's contract: build key, item plan, scratch and peer layouts, arguments.

The Triton build (triton_build.py), the runner and the tests read only this module; it is
pure Python, so a CPU checks every layout and the ticket order.

One launch = one Kimi-K3 MoE layer on one TP rank, S = 1..16 rows. Items in ticket order
(`stages`); an item waits only on done pairs of smaller tickets of its own launch, or on
peers' pushes (made by their items of earlier stages), so the launch finishes at any
residency and under the interpreter, where programs run one after another:

    oproj    NO      OC columns of o_proj (K = Ko) -> bf16 partial -> every rank's `ar1`
    col      S x NCH row s, RC columns: the ranks' partials in rank order -> o (bf16); the
                     new prefix (reset: o; else bf16(prefix + o)) -> `pnew` and, on live
                     rows, the prefix; per-source sums of squares and dots with
                     mlp_res_norm * mlp_res_proj over the chunk -> `ssq`, `dot`
    mix      S x NCH row s, the same columns: softmax over the sources (blocks
                     0..sources-1, the prefix) -> the mix (fp32) and its sum of squares
    norm     S x NCH row s, the same columns: post_attention_layernorm over the row's
                     sums -> x (bf16)
    router   NR x DKS  16 rows of this rank's E/tp router rows, one of DKS parts of K
                     (= H); the last part to finish sums the parts in order: fp32 logits
                     -> every rank's `lg`
    route    S       row s: sigmoid + bias top-k of the gathered logits -> ids, weights
    union    1       the union of the live rows' experts, ascending id -> the slot table
                     (route and union take their tickets before latdown's: they need only
                     the router's logits, and run while the latent and shared streams do.
                     When they came after the gather, an H100 timeline (stop 45, S = 1) had
                     the one route item start 44 us after its logits were in, on the
                     critical path)
    latdown  NL x DKS  LB rows of this rank's LAT/tp latent_down rows, likewise: bf16 ->
                     every rank's `lat`
    shup     NSU x DKS  SB gate + SB up rows of the shared gate_up, likewise: SiTU ->
                     `smid` (bf16)
    gather   S       row s of the gathered latent input -> `xlat`
    up       MAXSLOTS x NC  slot j, BN gate + BN up rows of w13 (K = LAT, MXFP4), SiTU ->
                     `mid[j]` (bf16); a slot past the route's count does nothing
    down     ND x NG DC latent columns over slot group q (slots in order, weights applied,
                     fp32) -> `dpart[d, q]`: many slots make long items, few slots many
    dsum     ND      the groups of column block d summed in group order, rounded once ->
                     every rank's `rl`
    shdown   NSD     SD output columns of the shared down (K = SI) -> every rank's `sh`
                     (after dsum: only the final items read `sh`. Before the up items an
                     H100 timeline (stop 49, S = 1) had 112 shdown items hold programs
                     while 40 of the 192 up items waited ~7 us for one; between up and
                     down (stops 51-52) every down item was taken after them, the
                     suspect of K2's 8% / 14% at S = 4 / 8 over stop 50 (stop 53, not
                     isolated). After dsum they fill the programs that idle while dsum
                     and lred run; untimed)
    lred     S       row s: the ranks' routed partials in rank order -> bf16 -> RMSNorm ->
                     `nlat` (bf16)
    upproj   NU      UC of this rank's H/tp up_proj rows (K = LAT) -> bf16 -> every rank's `upo`
    final    S x NF  row s, FC columns: bf16(bf16(sum of the ranks' `sh`) + `upo`) -> out
    handshake 1      final launches only: the TP fault handshake (as the FFN's)

The up stage is sized for the widest union (MAXSLOTS): the ticket count is static, so no
program has to learn the slot count before it knows how many tickets there are.

Peer regions are sized for 16 rows so that every width shares them, and one copy of each
suffices: a rank's launch n ends only after every peer's `upo` push of launch n, which each
peer makes after it read every region of launch n except `sh` and `upo`, and those a rank
overwrites only after its peers entered launch n + 1 (see `peer_layout`). They start past
K1's handshake pairs, so K1 and K2 launches of one step never overwrite each other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from mono_runtime.kernel.tiles import check_tile, tile_overrides
from mono_runtime.stream.layout import MX_FAST_ROWS
from mono_runtime.timeline import stamp_bytes

from ..config import KimiK3Config

MAX_ROWS = 16
PAIR = 8  # bytes of a mailbox pair
ALIGN = 256
TPS = (1, 2, 4, 8)


def p2(n: int) -> int:
    """n rounded up to a power of two (Triton block sizes)."""
    return 1 << max(0, (n - 1).bit_length())


TILES_ENV = "MONO_K2_TILES"  # e.g. "obk=128,sdk=128,occ=2": a benchmark's tile variant


def _step(k: int, want: int) -> int:
    """The largest power-of-two step <= `want` that divides k."""
    while k % want:
        want //= 2
    return want


@dataclass(frozen=True)
class K2Build:
    """A compiled variant: width `rows`, the config's shapes (its `tp`), the expert layout."""

    cfg: KimiK3Config
    rows: int
    packed: bool = True  # stream the experts as mxfp4-rot (False: the checkpoint's mxfp4-k32)
    timeline: bool = False  # stamp each item's program, ticket, start, ready, end, mark
    frag: bool = False  # the Gluon build: experts in mxfp4-frag (packed), streams on mma.sync

    def __post_init__(self) -> None:
        c = self.cfg
        if not 1 <= self.rows <= MAX_ROWS:
            raise ValueError(f"rows={self.rows}: K2 serves 1..{MAX_ROWS} rows")
        if c.tp not in TPS:
            raise ValueError(f"tp={c.tp}: expected one of {TPS}")
        for name, n in (
            ("hidden_size", c.hidden_size),
            ("latent_size", c.latent_size),
            ("routed_intermediate", c.routed_intermediate),
            ("shared_intermediate", c.shared_intermediate),
            ("o_proj_in", c.o_proj_in),
        ):
            if n % 32:
                raise ValueError(f"{name}={n}: must be a multiple of 32")
        if c.num_experts < 16 or c.latent_size < 16 or c.hidden_size < 16:
            raise ValueError("num_experts, latent_size and hidden_size must be >= 16")
        if c.experts_per_rank % 2 or c.latent_per_rank % 2 or c.hidden_per_rank % 16:
            raise ValueError("per-rank router / latent shares must be even, H/tp a multiple of 16")
        if self.frag and not self.packed:
            raise ValueError("frag: the Gluon build streams packed experts (packed=True)")
        self.plan  # noqa: B018 - the tiles must fit the shapes

    @property
    def tp(self) -> int:
        return self.cfg.tp

    @property
    def layout(self) -> str:
        if self.frag:
            return "mxfp4-frag"
        return "mxfp4-rot" if self.packed else "mxfp4-k32"

    @property
    def max_slots(self) -> int:
        """The widest union of routed experts a launch can pick."""
        return min(self.rows * self.cfg.num_experts_per_token, self.cfg.num_experts)

    @cached_property
    def plan(self) -> Plan:
        """Computed once a build: its tile overrides are read at the first use, not again
        at every launch that asks for the build's constexprs."""
        return Plan.of(self)

    def key(self) -> tuple:
        c = self.cfg
        return (
            "k2",
            self.rows,
            c.tp,
            self.layout,
            self.timeline,
            c.hidden_size,
            c.o_proj_in,
            c.latent_size,
            c.num_experts,
            c.num_experts_per_token,
            c.routed_intermediate,
            c.shared_intermediate,
            c.num_attn_res_blocks,
            c.rms_norm_eps,
            c.routed_scaling_factor,
            c.moe_renormalize,
            c.latent_moe_use_norm,
            c.activation_situ_beta,
            c.activation_situ_linear_beta,
        )


@dataclass(frozen=True)
class Plan:
    """Tiles (powers of two) and item counts. Every weight is streamed by
    mono_runtime.stream's `stream_rows`, weight rows as the dot's wide operand."""

    oc: int  # o_proj output columns of an oproj item
    no: int  # oproj items
    obk: int  # its K step (K = Ko)
    rc: int  # columns of a col, mix or norm item
    nch: int  # col (mix, norm) items per row
    rr: int  # router rows of a router item
    nr: int  # router items per K part
    rbk: int  # their K step (K = H)
    dks: int  # K parts of the router, latdown and shup row blocks (items per block)
    lb: int  # latent_down rows of a latdown item
    nl: int  # latdown row blocks
    sb: int  # shared gate (and up) rows of a shup item
    nsu: int
    sd: int  # output columns of a shdown item
    nsd: int
    sdk: int  # its K step (K = SI)
    bn: int  # gate (and up) rows of a routed up item
    nc: int  # up items per slot
    ubk: int  # K step of up items (K = LAT)
    uks: int  # K parts of a routed up item's gate and up rows (split K)
    dc: int  # latent columns of a down item
    nd: int
    ng: int  # slot groups of the down stage
    dbk: int  # its K step (K = RI)
    uc: int  # up_proj rows of an upproj item
    pbk: int  # its K step (K = LAT)
    nu: int
    fc: int  # columns of a final item
    nf: int
    stages: int
    warps: int
    occ: int  # programs an SM the runner launches (2 needs <= 113 KB of shared memory)
    upair: int  # a routed up item's gate and up rows in one loop: 1 two dots, 2 one tile
    ring: int  # 1: gate and up rows of up and shup items in one ring (the Gluon build)
    upf: int  # K columns of an upproj item's rows asked of L2 before it waits for lred
    xpf: int  # K columns of a latdown or shup item's part asked of L2 before x is in
    rpf: int  # the same for a router item's part
    rst: int  # a router item's ring depth
    rres: int  # 1: a router item's rows into shared memory before its wait (Gluon build)
    dring: int  # 1: a down item streams its group's slots in one ring (Gluon build)

    @classmethod
    def of(cls, b: K2Build) -> Plan:
        c = b.cfg
        h, ko, lat = c.hidden_size, c.o_proj_in, c.latent_size
        ri, si = c.routed_intermediate, c.shared_intermediate
        big = h >= 2048  # real shapes: tiles for bandwidth; tiny ones: several items a stage
        wide = big and b.frag  # the Gluon build's 64-row bf16 items (below)
        t = dict(
            # the router, latdown and shup stages run at once on few rows (E/tp, LAT/tp,
            # SI): split K, so that they fill the machine
            dks=4 if big else 2,
            # router rows of a router item: 16-row bf16 items keep only ~12 KB in flight a
            # program, but 64-row ones worked 24.7 us instead of ~10 and ended the router
            # stage at 50 us instead of 34 (H100, stop 52, S = 1). A share smaller than rr
            # streams its neighbours' rows and keeps its own (`_share`)
            rr=16,
            oc=_step(h, 64 if big else 32),
            # rows of a shared-up (gate and up each), latdown and upproj item, and the K
            # steps of those streams (rbk also the router's). The Gluon build takes 64 rows
            # at K steps of 128: its 16-row tiles are one warp's MMAs done by all four,
            # ~16 KB of weights in flight a program; 64 x 128 keeps the ring at 61 KB (two
            # programs an SM). H100 (stop 45, `k2.bench --layers 4`): 221.6 -> 189.5 us at
            # S = 1, 459.6 -> 427.7 at 16. The Triton build keeps 16 rows at 256 (64 there:
            # 120 KB, one program an SM). Tiny builds take latdown blocks wider than a TP4
            # rank's share, so the interpreter runs that path too
            sb=64 if wide else 16,
            lb=64 if wide else 16 if big else 32,
            uc=64 if wide else 16,
            rbk=128 if wide else 256,
            pbk=128 if wide else 256,
            sd=_step(h, 64 if big else 32),
            # routed up blocks of 64 rows: MXFP4 streams several times slower in fewer
            # (MX_FAST_ROWS); H200 at S = 1: 315.5 us with 16-row blocks, 258.4 with 64
            bn=_step(ri, MX_FAST_ROWS if big else 16),
            # K parts of a routed up item (the last to finish sums them in order and
            # applies SiTU): at S = 1 the up stage is 96 items, at most one an SM, and
            # more bytes in flight an item did not speed it (stop 49). Two parts (192
            # items) at S = 1 only, on the Gluon build (the one timed); H100 (stop 50,
            # `k2.bench --rows 1,4,16 --layers 4`): 141.5 / 190.3 / 375.1 us against
            # 144.3 / 186.1 / 337.7 one part (and with upproj in 32-row items 141.8
            # against 143.7). Its items still take ~16 us for half the bytes: an item's
            # MXFP4 decode, not its count, bounds the stage. Tiny builds take 2 (K steps
            # of 32), so that the interpreter runs the split
            uks=(2 if wide and b.rows == 1 else 1) if big else 2,
            # routed down items of 128 latent columns: a K step's e8m0 scales are then 512 B,
            # which Triton loads asynchronously (256 B at 64 columns: a synchronous load a
            # trip); H200: 255 / 346 / 653 -> 243 / 310 / 548 us at S = 1 / 4 / 16
            dc=_step(lat, 128 if big else 32),
            # two programs an SM (K steps of 128 keep the bf16 stages' shared memory near
            # 61 KB): on the H200 400 -> 316 / 860 -> 607 / 1653 -> 1082 us at S = 1 / 4 / 16
            obk=_step(ko, 128),
            sdk=_step(si, 128),
            dbk=_step(ri, 128),
            stages=3 if big else 2,
            occ=2 if big else 1,
            # gate and up as one 128-row tile (one dot: ptxas keeps the wgmma pipelined)
            # or two dots a K step (it serializes every wgmma of K2: C7515). H200 (stop 33,
            # different calls): one tile 264.0 / 347.2 / 602.0 us at S = 1 / 4 / 16, two
            # dots 243.1 / 309.8 / 547.9; tiny builds take one tile, so that the
            # interpreter runs it
            upair=1 if big else 2,
            # the Gluon build's gate and up rows of a routed and a shared up item in one
            # cp.async ring (as the FFN's pair 3): twice the bytes in flight, one prologue
            # (110.6 KB of shared memory, still two programs an SM). H100 (stop 49,
            # `k2.bench --rows 1,4,16 --layers 4`, one call): 146.8 / 187.6 / 341.6 us
            # against 146.9 / 193.9 / 353.7 one ring each; its up items' ring alone 4 deep
            # 146.5 / 188.3 / 340.7, 6 deep (one program an SM) 159.4 / 232.5 / 487.8. The
            # Triton build keeps one tile (`upair`); tiny builds take it, so that the
            # interpreter runs the shared pair's loop
            ring=1 if wide or not big else 0,
            # the first K columns of upproj's rows asked of L2 while dsum and lred run
            # (upf), of the router, latdown and shup rows while col / mix / norm do (xpf): 0,
            # none. Whole rows (stop 46) are, at the bench's TP 1, whole matrices (51 + ~64
            # MB, more than the L2) and the chains' own reads queued behind them; H100,
            # `k2.bench --rows 1,16 --layers 4` (one call): both whole 191.3 / 431.5 us at S
            # = 1 / 16, xpf off 186.6 / 420.0, both off 184.2 / 417.5. A ring's first steps
            # only (a few hundred columns an item) would fit: part `naps` times them. Tiny
            # builds prefetch 16, so that the compile tests build the prefetches
            upf=0 if big else 16,
            xpf=0 if big else 16,
            # the router's own: its 224 items of 16 rows (57 KB each at TP 1, 12.8 MB in
            # all: it fits the L2) are taken at ~1 us and wait ~22 for x while only oproj
            # streams, then work ~11.6 us at ~5 GB/s a program, the HBM far from busy
            # (H100, stop 53, S = 1): asked of L2 before the wait (rpf), or a deeper ring
            # (rst, 0: `stages`; 8 KB a step, 13 steps fit two programs an SM) might end
            # the router ~6 us sooner. Untimed; part `k2router` times them
            rpf=0 if big else 16,
            rst=0,
            # or every K step of a router item's rows (57 KB at TP 1) into shared memory
            # before the wait (`rres`, the Gluon build; 69 KB with a 3-deep ring of x, the
            # up items' 110.6 KB still the kernel's most). Untimed; part `k2router`
            rres=0,
            # slot groups of the down stage (at most one a slot): at S = 16, 28 x 8 = 224
            # items on 264 programs, each ~90 us for ~28 slots while 40 programs idle
            # (stop 53); 9 groups make 252 items. Untimed; part `k2router` times it
            ng=8 if big else 2,
            # a down item's slots in one ring (`frag_stream_experts`, the Gluon build's
            # MXFP4) after one wait for all their up items, as the FFN's: a slot is a
            # stream of only RI / dbk = 2 K steps, so one stream a slot drains and refills
            # its ring each time (stop 48's S = 16 timeline: 224 down items of ~25 slots
            # took 120 us for ~90 MB). H100 (stop 48, `k2.bench --layers 4`, one call):
            # 147.3 / 162.1 / 194.7 / 244.1 / 357.0 us at S = 1 / 2 / 4 / 8 / 16 against
            # 148.5 / 165.6 / 202.0 / 259.2 / 387.4 one stream a slot
            dring=1 if wide else 0,
        )
        if big:  # a real-shape build's, for tuning
            t = tile_overrides(TILES_ENV, t)
        walks = dict(oc=h, sb=si, lb=lat, sd=h, bn=ri, dc=lat, uc=c.hidden_per_rank)
        walks.update(obk=ko, sdk=si, dbk=ri)
        for name, k in walks.items():
            check_tile("K2", name, t[name], divides=k)
        check_tile("K2", "occ", t["occ"], least=1, most=2)
        check_tile("K2", "upair", t["upair"], least=1, most=2, pow2=False)
        check_tile("K2", "ring", t["ring"], least=0, most=1, pow2=False)
        check_tile("K2", "dring", t["dring"], least=0, most=1, pow2=False)
        for name, k in (("upf", lat), ("xpf", h // t["dks"])):
            if t[name]:
                check_tile("K2", name, t[name], most=k)
        if t["rpf"]:  # (up to a router item's whole part: 1792 at real shapes)
            check_tile("K2", "rpf", t["rpf"], most=h // t["dks"], pow2=False)
        check_tile("K2", "stages", t["stages"], least=1, pow2=False)
        rsteps = (h // t["dks"]) // _step(h // t["dks"], t["rbk"])  # a router item's K steps
        check_tile("K2", "rst", t["rst"], least=0, most=rsteps + 1, pow2=False)
        check_tile("K2", "ng", t["ng"], least=1, pow2=False)
        check_tile("K2", "rres", t["rres"], least=0, most=1, pow2=False)
        check_tile("K2", "dks", t["dks"], least=1, most=8)
        check_tile("K2", "rr", t["rr"], least=16, most=min(64, c.num_experts))
        ubk = _step(lat, 256 if big else 32)
        check_tile("K2", "uks", t["uks"], least=1, divides=lat // ubk)
        dks, oc, sb, sd, bn, dc, uc = (t[n] for n in ("dks", "oc", "sb", "sd", "bn", "dc", "uc"))
        rc = _step(h, 1024 if big else 32)
        fc = _step(h, 512 if big else 32)
        return cls(
            oc=oc,
            no=h // oc,
            obk=t["obk"],
            rc=rc,
            nch=h // rc,
            rr=t["rr"],
            nr=-(-c.experts_per_rank // t["rr"]),
            rbk=_step(h // dks, t["rbk"]),
            dks=dks,
            lb=t["lb"],
            nl=-(-c.latent_per_rank // t["lb"]),
            sb=sb,
            nsu=si // sb,
            sd=sd,
            nsd=h // sd,
            sdk=t["sdk"],
            bn=bn,
            nc=ri // bn,
            ubk=ubk,
            uks=t["uks"],
            pbk=_step(lat, t["pbk"]),
            dc=dc,
            nd=lat // dc,
            ng=min(b.max_slots, t["ng"]),
            dbk=t["dbk"],
            uc=uc,
            nu=c.hidden_per_rank // uc,
            fc=fc,
            nf=h // fc,
            stages=t["stages"],
            warps=4,
            occ=t["occ"],
            upair=t["upair"],
            ring=t["ring"],
            upf=t["upf"],
            xpf=t["xpf"],
            rpf=t["rpf"],
            rst=t["rst"] or t["stages"],
            rres=t["rres"],
            dring=t["dring"],
        )


STAGES = (
    "oproj",
    "col",
    "mix",
    "norm",
    "router",
    "route",
    "union",
    "latdown",
    "shup",
    "gather",
    "up",
    "down",
    "dsum",
    "shdown",
    "lred",
    "upproj",
    "final",
    "handshake",
)


def stages(b: K2Build, final: bool = True) -> list[tuple[str, int]]:
    """(stage, items) in ticket order: the one statement of the order the kernel follows."""
    p, s = b.plan, b.rows
    counts = dict(
        oproj=p.no,
        col=s * p.nch,
        mix=s * p.nch,
        norm=s * p.nch,
        router=p.nr * p.dks,
        route=s,
        union=1,
        latdown=p.nl * p.dks,
        shup=p.nsu * p.dks,
        shdown=p.nsd,
        gather=s,
        up=b.max_slots * p.nc * p.uks,
        down=p.nd * p.ng,
        dsum=p.nd,
        lred=s,
        upproj=p.nu,
        final=s * p.nf,
        handshake=int(final),
    )
    return [(name, counts[name]) for name in STAGES]


# Each stage's inputs by stage: the stages whose done pairs (`waits`) or pushes (the
# polls of col, route, gather, lred and final) its items wait for
# (`mono_runtime.timeline.stage_deps`).
INPUTS = {
    "col": ("oproj",),
    "mix": ("col",),
    "norm": ("mix",),
    "router": ("norm",),
    "route": ("router",),
    "union": ("route",),
    "latdown": ("norm",),
    "shup": ("norm",),
    "gather": ("latdown",),
    "up": ("union", "gather"),
    "shdown": ("shup",),
    "down": ("union", "up"),
    "dsum": ("down",),
    "lred": ("dsum",),
    "upproj": ("lred",),
    "final": ("upproj", "shdown"),
    "handshake": ("final",),
}


def stage_of(b: K2Build, ticket: int) -> str:
    """The stage of a ticket (spec order)."""
    for name, first in reversed(starts(b).items()):
        if ticket >= first:
            return name
    raise ValueError(f"ticket {ticket} < 0")


def starts(b: K2Build) -> dict[str, int]:
    """The first ticket of each stage (the handshake's when it runs)."""
    out, t = {}, 0
    for name, n in stages(b):
        out[name] = t
        t += n
    return out


def tickets(b: K2Build, final: bool) -> int:
    return sum(n for _, n in stages(b, final))


def waits(b: K2Build, nslots: int) -> dict[int, list[int]]:
    """Ticket -> the tickets whose done pairs it waits for, when the union holds `nslots`
    slots (the kernel's waits, item by item; peers' pushes are not tickets)."""
    p, s, st = b.plan, b.rows, starts(b)
    out: dict[int, list[int]] = {}

    def span(stage: str, first: int = 0, n: int | None = None) -> list[int]:
        n = dict(stages(b))[stage] if n is None else n
        return list(range(st[stage] + first, st[stage] + first + n))

    for r in range(s):
        for ch in range(p.nch):
            out[st["mix"] + r * p.nch + ch] = span("col", r * p.nch, p.nch)
            out[st["norm"] + r * p.nch + ch] = span("mix", r * p.nch, p.nch)
    for stage in ("router", "latdown", "shup"):
        for t in span(stage):
            out[t] = span("norm")
    for t in span("shdown"):
        out[t] = span("shup")
    out[st["union"]] = span("route")
    for u in span("up"):
        out[u] = span("union") + span("gather")
    for d in range(p.nd):
        for q in range(p.ng):
            j0, j1 = group_slots(b, nslots, q)
            n = p.nc * p.uks  # up items a slot
            out[st["down"] + d * p.ng + q] = span("union") + span("up", j0 * n, (j1 - j0) * n)
        out[st["dsum"] + d] = span("down", d * p.ng, p.ng)
    for t in span("upproj"):
        out[t] = span("lred")
    out[st["handshake"]] = span("final")
    return out


def group_slots(b: K2Build, nslots: int, q: int) -> tuple[int, int]:
    """Slots [j0, j1) of down group q when the union holds `nslots`."""
    per = -(-nslots // b.plan.ng)
    return min(q * per, nslots), min((q + 1) * per, nslots)


# -- layouts ---------------------------------------------------------------------------


def _layout(items: list[tuple[str, int]], base: int = 0) -> dict[str, tuple[int, int]]:
    out, off = {}, base
    for name, nbytes in items:
        out[name] = (off, nbytes)
        off += -(-nbytes // ALIGN) * ALIGN
    return out


def _end(layout: dict[str, tuple[int, int]]) -> int:
    off, n = list(layout.values())[-1]
    return off + -(-n // ALIGN) * ALIGN


def scratch_layout(b: K2Build) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region of one width's scratch (this rank only).

    done   pairs[tickets]: item t's (tag, 1) once it finished (tags: never zeroed)
    pnew   bf16[S, H]   the new prefix (every row: padding rows mix it but never store it)
    ssq    fp32[S, NB + 1, NCH]  per row, source (blocks, then the prefix at NB) and chunk
    dot    fp32[S, NB + 1, NCH]  the same, dot with mlp_res_norm * mlp_res_proj
    mix    fp32[S, H]   the AttnRes mix (mix items -> norm items)
    ssq2   fp32[S, NCH] the mix's sum of squares, by chunk
    x      bf16[S, H]   the MoE input
    smid   bf16[S, SI]  the shared expert's SiTU output
    xlat   bf16[S, LAT] the gathered latent input of the routed experts
    table  the route: int32 nslots, int32 slot_expert[MAXSLOTS], fp32 wtab[MAXSLOTS, S],
           int32 topk_ids[S, K], fp32 topk_w[S, K]
    mid    bf16[MAXSLOTS, S, RI]  the routed experts' SiTU outputs, by slot
    count  int32[NR + NL + NSU]  K parts finished per row block of router, latdown, shup
           (the last resets it)
    ucount int32[MAXSLOTS, NC]  K parts finished per routed up item (UKS > 1; likewise)
    kpart  fp32 their parts: [NR, DKS, 16, S], [NL, DKS, LB, S], then [NSU, DKS, 2 SB, S]
    upart  fp32[MAXSLOTS, NC, UKS, 2 BN, S]  the routed up items' K parts (UKS > 1)
    dpart  fp32[ND, NG, DC, S]  the down groups' partials
    nlat   bf16[S, LAT] the normed latent the up-projection reads
    timeline  int64[tickets, 6] (timeline builds only): each item's program and SM, ticket,
           start, ready, end and mark (device clock, ns; the poll count under the interpreter)
    """
    c, s, p = b.cfg, b.rows, b.plan
    h, lat, nb = c.hidden_size, c.latent_size, c.num_attn_res_blocks
    return _layout(
        [
            ("done", PAIR * tickets(b, True)),
            ("pnew", 2 * s * h),
            ("ssq", 4 * s * (nb + 1) * b.plan.nch),
            ("dot", 4 * s * (nb + 1) * b.plan.nch),
            ("mix", 4 * s * h),
            ("ssq2", 4 * s * b.plan.nch),
            ("x", 2 * s * h),
            ("smid", 2 * s * c.shared_intermediate),
            ("xlat", 2 * s * lat),
            ("table", sum(table_sizes(b).values())),
            ("mid", 2 * b.max_slots * s * c.routed_intermediate),
            ("count", 4 * (p.nr + p.nl + p.nsu)),
            ("ucount", 4 * b.max_slots * p.nc if p.uks > 1 else 0),
            ("kpart", 4 * p.dks * s * (p.rr * p.nr + p.lb * p.nl + 2 * p.sb * p.nsu)),
            ("upart", 4 * b.max_slots * p.nc * p.uks * 2 * p.bn * s if p.uks > 1 else 0),
            ("dpart", 4 * b.plan.nd * b.plan.ng * b.plan.dc * s),
            ("nlat", 2 * s * lat),
        ]
        + ([("timeline", stamp_bytes(tickets(b, True)))] if b.timeline else [])
    )


def table_sizes(b: K2Build) -> dict[str, int]:
    s, k, m = b.rows, b.cfg.num_experts_per_token, b.max_slots
    return {
        "nslots": 4,
        "slot_expert": 4 * m,
        "wtab": 4 * m * s,
        "topk_ids": 4 * s * k,
        "topk_w": 4 * s * k,
    }


def table_offsets(b: K2Build) -> dict[str, int]:
    """Byte offsets inside the `table` region."""
    out, off = {}, 0
    for name, n in table_sizes(b).items():
        out[name] = off
        off += n
    return out


def scratch_bytes(b: K2Build) -> int:
    return _end(scratch_layout(b))


def peer_base(tp: int) -> int:
    """Where K2's peer regions start: past K1's handshake pairs (kda.triton_build)."""
    return -(-PAIR * tp // ALIGN) * ALIGN


def peer_layout(cfg: KimiK3Config) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region in a rank's peer data (past the runtime's head).

    ar1  pairs[tp src][16][H / 2]  bf16 pairs of the o_proj partials
    lg   pairs[16][E]              fp32 router logits, each from the rank that owns it
    lat  pairs[16][LAT / 2]        bf16 pairs of the latent input, likewise
    rl   pairs[tp src][16][LAT / 2] bf16 pairs of the routed partials
    sh   pairs[tp src][16][H / 2]  bf16 pairs of the shared partials
    upo  pairs[16][H / 2]          bf16 pairs of the up-projection, from each column's owner
    hs   pairs[tp]                 the step-end fault handshake (final launches)

    Reuse across launches: a rank's launch n ends after its final items read every peer's
    `upo` pushes of launch n; a peer pushes `upo` after its lred items, which come after
    its col (ar1), route (lg), gather (lat) and lred (rl) reads. `sh` and `upo` of launch
    n + 1 come after a push that needs every peer's launch n + 1 oproj, so after that
    peer's launch n finished reading them.
    """
    tp, h, lat = cfg.tp, cfg.hidden_size, cfg.latent_size
    row, lrow = PAIR * (h // 2), PAIR * (lat // 2)
    return _layout(
        [
            ("ar1", tp * MAX_ROWS * row),
            ("lg", PAIR * MAX_ROWS * cfg.num_experts),
            ("lat", MAX_ROWS * lrow),
            ("rl", tp * MAX_ROWS * lrow),
            ("sh", tp * MAX_ROWS * row),
            ("upo", MAX_ROWS * row),
            ("hs", PAIR * tp),
        ],
        peer_base(tp),
    )


def peer_bytes(cfg: KimiK3Config) -> int:
    return _end(peer_layout(cfg))


# -- arguments ---------------------------------------------------------------------------

ARGS: tuple[tuple[str, str], ...] = (
    ("core", "bf16[S, Ko] this rank's o_proj input (the attention output's K slice)"),
    ("prefix", "bf16[S, H] the AttnRes prefix, updated in place on live rows"),
    ("blocks", "bf16[S, >= sources, H] the AttnRes block bank (rows may be strided)"),
    ("out", "bf16[S, H] the layer's output, all-reduced (0 on padding rows)"),
    ("slots", "int64[S] the rows' KV slots: negative = padding"),
    ("weights", "the layer's K2Weights (experts in the build's layout)"),
    ("scratch", "uint8 this width's scratch region (scratch_layout)"),
    ("sources", "int32 AttnRes block sources before the prefix (KimiK3Config.mlp_attn_res)"),
    ("reset", "int32 1: a block-write layer (the prefix restarts at o)"),
    ("slot", "int32 the launch's tag slot in its step (0..255; also its ticket counter)"),
    ("final", "int32 1: the launch ends in the TP fault handshake"),
)
"""Then mono_runtime's: ctl, health, tickets, peers, rank, world."""
