"""The drafter kernel's contract: build key, item plan, scratch and peer layouts, arguments.

The Triton build (triton_build.py), the runner and the tests read only this module; it is
pure Python, so a CPU checks every layout and the ticket order.

One launch = every draft layer and the final norm for up to `requests` requests of one
step on one TP rank (the narrow build serves 1-2 requests, the wide one 3-8): rows are
request-major, `query_len` rows a request, up to `rows` of them. Items in ticket order
(`stages`), the layer's stages repeated for every layer, then the final norm; an item
waits only on done pairs of smaller tickets of its own launch, or on peers' pushes made by
their items of earlier stages, so the launch finishes at any residency and under the
interpreter, where programs run one after another:

    norm    GROUPS x RI  row group s (RB rows): layer 0 input_layernorm of the embedding (the
                    residual); later layers the ranks' MLP partials (`ar2`, previous
                    layer) in rank order -> bf16, + residual -> the new residual,
                    input_layernorm -> `xa`
    qkva    NQA x QKS  QA rows of fused_qkv_a_proj over K part j -> `qkv` (bf16; fp32
                    parts when QKS > 1)
    qkvn    GROUPS  row group s: q_a_layernorm -> `qc`; kv_a_layernorm, RoPE of k_pe -> the
                    cache entry at the row's slot (nothing for a negative slot)
    qb      NQB     QB rows of q_b_proj -> `q` (bf16)
    absorb  n x NLA head h, LA latent columns: q_nope @ W_UK -> `qlat` (bf16); the chunk-0
                    item also ropes q_pe -> `qpe` (an fp8 cache: both through e4m3)
    attn    REQ x NHG x NSPLIT  request r, head group g, split j of the request's KV pages:
                    non-causal latent MQA of the group's query rows over the split's pages
                    (online softmax) -> the split's partial (`po`, `pm`, `pl`)
    comb    REQ x NHG x NLC  request r, head group g, LC latent columns: the splits'
                    partials merged in a fixed order -> latent (`lat`, bf16)
    uv      n x NVB  head h, VB of its W_UV rows (kv_b_proj's v rows): every row's latent
                    -> `v` (bf16), W_UV read once for all requests
    oproj   NO      OC columns of o_proj -> bf16 partial -> every rank's `ar1`
    post    GROUPS x RI  row group s: the ranks' partials in rank order -> bf16, + residual
                    -> the new residual, post_attention_layernorm -> `xm`
    gu      NGU x GKS  GB gate + GB up rows of gate_up_proj over K part j; the last part
                    to finish sums the parts, act_and_mul -> `mid` (bf16)
    down    ND x DKS  OC columns of down_proj over K part j (the part's gate_up row tiles:
                    part 0's items start while the last row tiles are still streamed); the
                    last part to finish sums the parts -> bf16 partial -> every rank's `ar2`
    final   GROUPS x RI  row group s: the last layer's `ar2` + residual, final_norm -> out
                    (0 on padding requests, seq_len 0)

A row stage's group has RI items: one (the whole row, chunk after chunk, then the norm's
second pass), or one a chunk of RC columns (tile `rs`), each that chunk's all-reduce and
residual, the last of the group to finish (a counter) summing the chunks' squares in chunk
order and making the second pass for the row: the same numbers, the chunks' latencies
side by side rather than in sequence. An item of a row stage waits for all its group's
items of the row stage before (they wrote the residual and the norm's input it rewrites).

Attention over a long context is split: each (request, head group) has NSPLIT items, each
walking a contiguous share of the request's KV pages, and one comb item merges them in a
fixed order, so the result does not depend on which program ran which split.

Tags: a launch holds `layers` consecutive tag slots; layer k's pushes carry slot0 + k's
tag, so `ar1` and `ar2` need one copy each (a rank pushes layer k + 1's `ar1` only after
it read every peer's layer-k `ar2`, which each peer pushed after it read its layer-k
`ar1`; likewise for `ar2`) and a pair of layer k can never be taken for one of layer k + 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import gcd

from mono_runtime.kernel.tiles import check_tile, tile_overrides
from mono_runtime.timeline import stamp_bytes

from .config import DrafterConfig

MAX_REQUESTS = 8  # requests of one launch (the wide build)
NARROW = 2  # requests of the narrow build
MAX_QUERY = 16  # query rows of one request: one dot tile
MAX_LAYERS = 16  # tag slots a launch holds
PAIR = 8  # bytes of a mailbox pair
ALIGN = 256
TPS = (1, 2, 4, 8)
TILE = 16  # token rows of every dot tile's activation side
TILES_ENV = "MONO_DRAFTER_TILES"  # e.g. "gks=7,occ=1": a benchmark's tile variant


def p2(n: int) -> int:
    """n rounded up to a power of two (Triton block sizes)."""
    return 1 << max(0, (n - 1).bit_length())


def _down_parts(tiles: int) -> int:
    """K parts of down_proj's items over `tiles` gate_up row tiles (each part waits for a
    whole number of them): 3 where 3 divide them, else 2 where 2 do, else 1."""
    return 3 if tiles % 3 == 0 else 2 if tiles % 2 == 0 else 1


def _step(k: int, want: int) -> int:
    """The largest power-of-two step <= `want` that divides k."""
    while k % want:
        want //= 2
    return want


def build_problem(cfg: DrafterConfig) -> str | None:
    """Why no drafter build serves `cfg` (the kernel's shape limits), or None."""
    if cfg.tp not in TPS:
        return f"tp {cfg.tp}: the drafter kernel serves TP {TPS}"
    if not 1 <= cfg.num_hidden_layers <= MAX_LAYERS:
        return f"num_hidden_layers {cfg.num_hidden_layers}: a launch holds 1..{MAX_LAYERS}"
    if cfg.query_len > MAX_QUERY:
        return f"query_len {cfg.query_len}: a request's rows must fit one {MAX_QUERY}-row tile"
    for name, n in (
        ("hidden_size", cfg.hidden_size),
        ("q_lora_rank", cfg.q_lora_rank),
        ("o_proj_in", cfg.o_proj_in),
        ("local_intermediate", cfg.local_intermediate),
    ):
        if n % 16:
            return f"{name} {n}: must be a multiple of 16"
    for name, n in (
        ("kv_lora_rank", cfg.kv_lora_rank),
        ("qk_nope_head_dim", cfg.qk_nope_head_dim),
        ("qk_rope_head_dim", cfg.qk_rope_head_dim),
        ("v_head_dim", cfg.v_head_dim),
    ):
        if n & (n - 1) or n < (2 if name == "qk_rope_head_dim" else 16):
            return f"{name} {n}: must be a power of two (>= 16 but for RoPE)"
    if cfg.qkv_a_rows < 16 or cfg.q_b_rows < 16:
        return "fused_qkv_a_proj and q_b_proj need >= 16 rows a rank"
    return None


@dataclass(frozen=True)
class DrafterBuild:
    """A compiled variant: the config's shapes (its `tp`), narrow (1-2 requests) or wide
    (3-8)."""

    cfg: DrafterConfig
    wide: bool
    timeline: bool = False  # stamp each item's program, ticket, start, ready, end, mark

    def __post_init__(self) -> None:
        problem = build_problem(self.cfg)
        if problem:
            raise ValueError(problem)

    @property
    def tp(self) -> int:
        return self.cfg.tp

    @property
    def requests(self) -> int:
        return MAX_REQUESTS if self.wide else NARROW

    @property
    def rows(self) -> int:
        return self.requests * self.cfg.query_len

    @property
    def tiles(self) -> int:
        """16-row tiles of the activation side (row regions are padded to them): 1, 2 or 4,
        so that a projection streams its weights once for all rows (`stream_rows` of up to
        64), then whole 64-row passes (a query_len past 8 at 8 requests)."""
        t = -(-self.rows // TILE)
        return 1 << (t - 1).bit_length() if t <= 4 else -(-t // 4) * 4

    @property
    def pass_rows(self) -> int:
        """Rows of one stream over a projection's weights (its dot's N side)."""
        return min(self.tiles, 4) * TILE

    @property
    def groups(self) -> int:
        """Row groups: the items of each row stage."""
        return self.rows // self.plan.rb

    @cached_property
    def plan(self) -> Plan:
        """Computed once a build: its tile overrides are read at the first use, not again
        at every launch that asks for the build's constexprs."""
        return Plan.of(self)

    def key(self) -> tuple:
        c = self.cfg
        return (
            "drafter",
            "wide" if self.wide else "narrow",
            c.tp,
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.q_lora_rank,
            c.kv_lora_rank,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.intermediate_size,
            c.hidden_act,
            c.rms_norm_eps,
            c.query_len,
            c.block_size,
            c.fp8_cache,
            self.timeline,
        )


@dataclass(frozen=True)
class Plan:
    """Tiles (powers of two) and item counts. Every projection is streamed by
    mono_runtime.stream's `stream_rows`, weight rows as the dot's wide operand against the
    launch's row tiles."""

    qa: int  # fused_qkv_a rows of a qkva item (the last item's tile ends at the last row)
    nqa: int  # row tiles of fused_qkv_a: nqa x qks qkva items
    qks: int  # K parts of a row tile (qkvn sums the parts' fp32 outputs in part order)
    qbn: int  # q_b rows of a qb item (likewise)
    nqb: int
    la: int  # latent columns of an absorb item
    nla: int
    lc: int  # latent columns of a comb item (its share of every split's partial)
    nlc: int
    vb: int  # W_UV rows of a uv item (of a head's v_head_dim)
    nvb: int
    hg: int  # heads of an attention group
    nhg: int
    qhr: int  # query rows of an attention tile (hg x query_len, padded)
    rp: int  # RoPE columns padded for the dot (>= 16)
    nsplit: int  # KV splits of a request and head group
    kc: int  # cache entries an attention step reads (a page in steps of kc)
    oc: int  # output columns of an oproj / down item
    no: int
    gb: int  # gate (and up) rows of a gu item
    ngu: int  # row tiles of gate_up: ngu x gks gu items
    gks: int  # K parts of a gu tile (the last part to finish activates: dt.split_k)
    dks: int  # K parts of a down item, part-major tickets (the last to finish pushes)
    hk: int  # K steps: K = H
    qk: int  # K = q_lora_rank
    vk: int  # K = local heads x v
    ik: int  # K = local intermediate
    lk: int  # K = kv_lora_rank
    rc: int  # columns of a row item's chunk: H padded to a power of two, <= 4096 (masked)
    qc: int  # columns of a qkvn item's q_c block: q_lora_rank padded to a power of two
    rb: int  # rows of a row item (norm, qkvn, post, final): a power of two dividing Q
    # a row group's norm / post / final items: 1 (one item the whole row), or one a chunk
    # of rc columns (tile rs: each its chunk's all-reduce and residual at once; the last to
    # finish normalizes the row)
    ri: int
    stages: int
    warps: int
    occ: int  # programs an SM the runner launches (2 fits: <= 113 KB shared, 255 registers)
    # which items ask L2 for their weight rows before their wait (only while their inputs
    # are not in: `decode_triton.done_already`): 0 none, 1 every projection's (absorb's
    # W_UK and uv's W_UV rows too), 2 only qkv_a's and q_b's (a layer's MLP and o_proj
    # rows are more than L2 holds: their requests queue ahead of every other stage's
    # misses)
    pf: int
    gpair: int  # a gu item's gate and up rows in one loop (stream_row_pair): 1 two dots, 2 one
    ast: int  # software-pipeline depth of an attn item's loop over its KV chunks (1: none)
    cst: int  # software-pipeline depth of a comb item's loop over its split pairs (1: none)

    @classmethod
    def of(cls, b: DrafterBuild) -> Plan:
        c = b.cfg
        big = c.hidden_size >= 2048  # real shapes: tiles for bandwidth; tiny: several items
        n, q = c.local_heads, c.query_len
        gb = _step(c.local_intermediate, 32 if big else 16)
        t = dict(
            qa=64 if big else 16,
            qbn=64 if big else 16,
            la=_step(c.kv_lora_rank, 128),
            # a (request, head group)'s merge in latent column chunks: one item the whole
            # [16, 512] fp32 partials took 21.8 us a comb item (stop 54, H100: one program
            # serially loading 17 splits of 32 KB, then 2 heads' W_UV), which everything
            # after waited for; 128 columns hold 8 KB a split, two splits a trip in
            # registers. Tiny: 2 chunks, so that the interpreter tests the split
            lc=_step(c.kv_lora_rank, 128 if big else 16),
            # W_UV in its own stage, heads x 32-row items, one stream over all the launch's
            # rows (comb streamed a head's 128 KB once a request)
            vb=_step(c.v_head_dim, 32 if big else 16),
            oc=_step(c.hidden_size, 64 if big else 16),
            gb=gb,
            # KV splits at 1-2 requests: 32 is 17% faster than 16 at 32K cached tokens, 2%
            # at 8K, 4% slower at 1K (H200, stop 33); 8 splits 41% slower at 32K
            nsplit=32 if big else 3,
            nsplit_wide=4 if big else 2,
            kc=min(c.block_size, 32),
            kstep=128,  # K steps: 3 stages of a 64 x 128 bf16 tile and its rows in 60 KB
            stages=3 if big else 2,
            # one program an SM: two fit (60 / 96 KB of shared memory, 255 registers) and
            # made K2 21-35% faster (H200, stop 29), but the drafter's row items then took
            # 20 us of work beside a neighbour, 1.3 alone: 923.9 / 1323.8 / 1441.8 /
            # 5318.5 us at 1 / 8 requests x 1K / 32K cached tokens against 888.9 / 1272.8
            # / 1336.0 / 4480.0 with one (H100, stop 56, part `drafter-tune`)
            occ=1,
            pf=1,
            # gate and up rows of a gu item in one loop (one pipeline ramp), as two dots a K
            # step (1): the drafter 1-6% faster at 1 and 8 requests, 1K-32K cached tokens
            # (stop 33); as one tile (2) not yet timed. Tiny builds: one tile narrow, two
            # dots wide, so that the interpreter runs both
            gpair=1 if big else 2 - b.wide,
            # an attn item's KV chunks: a 32-entry chunk cost two latencies (its block-table
            # entry, then its rows), ~1.4 us, so an item of 8 requests' 2K positions took
            # 160-220 us. Pipelined two deep, the drafter is 7% / 16% faster at 1 request
            # and 8K / 32K cached tokens, 13% / 22% at 8 requests (H200, stop 32; three
            # deep 1-2% less); asking L2 for a split's pages first was no better (-1..+3%)
            ast=2,
            # a comb item's loop over its split pairs, the next pair loaded while this one
            # is summed (CST 2): at the whole latent's [16, 512] partials two deep was
            # within 1.6% either way at 1 and 8 requests, 16 splits (stop 33)
            cst=1,
            # a row item's columns a trip (the last trip masked): 2048 is 2.5-7% faster
            # than 1024 at 1 and 8 requests, 1K-32K cached tokens (stop 32)
            rc=2048 if big else 32,
            # a row group's items its rc-column chunks: 2-5% faster at 1 request, 1-4%
            # slower at 8 (stop 32); the tiny wide builds split too, so the interpreter
            # tests both plans
            rs=int(not b.wide) if big else int(b.wide),
            # K parts of a row tile: qkv_a's 33 items of 64 rows and gate_up's 72 of 32 + 32
            # leave SMs idle; in 4 parts each (132 and 288 items at TP8) a layer is 12-17%
            # faster at 8 requests and 1K-8K cached tokens (stop 31); gate_up in 8 parts
            # within 3% either way at 8 requests in two calls, 2-6% slower at 1 (stop 32).
            # Tiny builds split in 2 (gate_up in 3 at a hidden size of 48), so that the
            # interpreter tests the parts' sums, a count not a power of two among them
            qks=4 if big else 2,
            gks=4 if big else 3 - bool(c.hidden_size % 48),
            # K parts of down_proj, each waiting only for its share of gate_up's row tiles:
            # in 3, 837.2 / 1242.0 / 1279.5 / 4200.7 us at 1 / 8 requests x 1K / 32K cached
            # tokens against 887.0 / 1272.0 / 1339.7 / 4480.1 in one (H100, stop 56, one
            # program an SM, same call); in 2, or none, where 3 do not divide gate_up's row
            # tiles (a model's intermediate size is its own). Tiny builds the same (3 at an
            # intermediate of 48, 2 at 64), so that the interpreter tests the parts and waits
            dks=_down_parts(c.local_intermediate // gb),
        )
        if big:  # a real-shape build's, for tuning
            t = _checked(tile_overrides(TILES_ENV, t), c)
        qa = min(t["qa"], p2(c.qkv_a_rows) // 2 or 16)
        qbn = min(t["qbn"], max(16, p2(c.q_b_rows) // 2))
        # a head group's query rows: one 16-row tile (its fp32 [rows, L] output in registers)
        hg = max(d for d in range(1, n + 1) if n % d == 0 and d * q <= 16)
        la, lc, vb, oc, gb, kstep = t["la"], t["lc"], t["vb"], t["oc"], t["gb"], t["kstep"]
        rc = min(p2(c.hidden_size), t["rc"])  # the last chunk masked
        return cls(
            qa=qa,
            nqa=-(-c.qkv_a_rows // qa),
            qks=t["qks"],
            qbn=qbn,
            nqb=-(-c.q_b_rows // qbn),
            la=la,
            nla=c.kv_lora_rank // la,
            lc=lc,
            nlc=c.kv_lora_rank // lc,
            vb=vb,
            nvb=c.v_head_dim // vb,
            hg=hg,
            nhg=n // hg,
            qhr=max(16, p2(hg * q)),
            rp=max(16, p2(c.qk_rope_head_dim)),
            nsplit=t["nsplit_wide"] if b.wide else t["nsplit"],
            kc=t["kc"],
            oc=oc,
            no=c.hidden_size // oc,
            gb=gb,
            ngu=c.local_intermediate // gb,
            gks=t["gks"],
            dks=t["dks"],
            hk=_step(gcd(c.hidden_size // t["qks"], c.hidden_size // t["gks"]), kstep),
            qk=_step(c.q_lora_rank, kstep),
            vk=_step(c.o_proj_in, kstep),
            ik=_step(c.local_intermediate // t["dks"], kstep),
            lk=_step(c.kv_lora_rank, kstep),
            rc=rc,
            ri=-(-c.hidden_size // rc) if t["rs"] else 1,
            qc=p2(c.q_lora_rank),  # masked past q_lora_rank
            rb=1 if big else q & -q,
            stages=t["stages"],
            warps=4,
            occ=t["occ"],
            pf=t["pf"],
            gpair=t["gpair"],
            ast=t["ast"],
            cst=t["cst"],
        )


def _checked(t: dict[str, int], c: DrafterConfig) -> dict[str, int]:
    """Overridden tiles refused by name unless each is a power of two (>= 16 for a dot's
    side) dividing what it tiles, with 1..64 splits, 1..8 stages, 1 or 2 programs an SM,
    prefetch mode 0..2, K parts of qkv_a and gate_up (any count) leaving a whole number of
    16-column steps a part."""
    walks = dict(
        qa=None,
        qbn=None,
        la=c.kv_lora_rank,
        lc=c.kv_lora_rank,
        vb=c.v_head_dim,
        oc=c.hidden_size,
        gb=c.local_intermediate,
        kc=c.block_size,
        kstep=c.o_proj_in,
        rc=None,
    )
    for name, whole in walks.items():
        check_tile("drafter", name, t[name], divides=whole)
    for name, most in dict(nsplit=64, nsplit_wide=64, stages=8, occ=2).items():
        check_tile("drafter", name, t[name], least=1, most=most, pow2=False)
    check_tile("drafter", "pf", t["pf"], least=0, most=2, pow2=False)
    check_tile("drafter", "gpair", t["gpair"], least=0, most=2, pow2=False)
    check_tile("drafter", "ast", t["ast"], least=1, most=4, pow2=False)
    check_tile("drafter", "cst", t["cst"], least=1, most=4, pow2=False)
    check_tile("drafter", "rs", t["rs"], least=0, most=1, pow2=False)
    # down's K parts each wait for a whole number of gate_up's row tiles
    check_tile(
        "drafter", "dks", t["dks"], least=1, divides=c.local_intermediate // t["gb"], pow2=False
    )
    for name in ("qks", "gks"):  # any count: 7 parts of gate_up's 72 row tiles are 504
        # items, 1.9 waves of 264 programs (two an SM), where 4 parts' 288 are 1.1
        check_tile("drafter", name, t[name], least=1, divides=c.hidden_size // 16, pow2=False)
    return t


LAYER_STAGES = (
    "norm",
    "qkva",
    "qkvn",
    "qb",
    "absorb",
    "attn",
    "comb",
    "uv",
    "oproj",
    "post",
    "gu",
    "down",
)


def layer_stages(b: DrafterBuild) -> list[tuple[str, int]]:
    """(stage, items) of one layer, in ticket order."""
    p, r = b.plan, b.requests
    s = b.rows // p.rb
    counts = dict(
        norm=s * p.ri,
        qkva=p.nqa * p.qks,
        qkvn=s,
        qb=p.nqb,
        absorb=b.cfg.local_heads * p.nla,
        attn=r * p.nhg * p.nsplit,
        comb=r * p.nhg * p.nlc,
        uv=b.cfg.local_heads * p.nvb,
        oproj=p.no,
        post=s * p.ri,
        gu=p.ngu * p.gks,
        down=p.no * p.dks,
    )
    return [(name, counts[name]) for name in LAYER_STAGES]


def per_layer(b: DrafterBuild) -> int:
    return sum(n for _, n in layer_stages(b))


def layer_starts(b: DrafterBuild) -> dict[str, int]:
    """The first ticket of each stage within a layer (add k x per_layer for layer k)."""
    out, t = {}, 0
    for name, n in layer_stages(b):
        out[name] = t
        t += n
    return out


def final_start(b: DrafterBuild) -> int:
    return b.cfg.num_hidden_layers * per_layer(b)


def tickets(b: DrafterBuild) -> int:
    return final_start(b) + b.groups * b.plan.ri


def stage_of(b: DrafterBuild, t: int) -> tuple[int, str, int]:
    """(layer, stage, index in the stage) of ticket t (layer = layers for the final norm)."""
    if t >= final_start(b):
        return b.cfg.num_hidden_layers, "final", t - final_start(b)
    k, local = divmod(t, per_layer(b))
    for name, n in layer_stages(b):
        if local < n:
            return k, name, local
        local -= n
    raise AssertionError("unreachable")


def waits(b: DrafterBuild) -> dict[int, list[int]]:
    """Ticket -> the tickets whose done pairs it waits for (the kernel's waits, item by
    item; peers' pushes are not tickets). An attn item needs the block's cache entries
    (qkvn) too: they happen before every absorb item it waits for."""
    p = b.plan
    st, pl, out = layer_starts(b), per_layer(b), {}
    counts = dict(layer_stages(b))
    ri = p.ri  # a row group's items: a row stage's item waits for all of its group's

    def span(k: int, stage: str, first: int = 0, n: int | None = None) -> list[int]:
        n = counts[stage] if n is None else n
        base = k * pl + st[stage] + first
        return list(range(base, base + n))

    for k in range(b.cfg.num_hidden_layers):
        base = k * pl
        for s in range(b.groups):
            for c in range(ri):
                if k:
                    out[base + st["norm"] + s * ri + c] = span(k - 1, "post", s * ri, ri)
                out[base + st["post"] + s * ri + c] = span(k, "norm", s * ri, ri)
            out[base + st["qkvn"] + s] = span(k, "qkva")
        for stage, after in (
            ("qkva", "norm"),
            ("qb", "qkvn"),
            ("absorb", "qb"),
            ("attn", "absorb"),
            ("uv", "comb"),
            ("oproj", "uv"),
            ("gu", "post"),
        ):
            for t in span(k, stage):
                out[t] = span(k, after)
        tiles = p.ngu // p.dks * p.gks  # gu items of one down K part's row tiles
        for i in range(counts["down"]):
            out[base + st["down"] + i] = span(k, "gu", i // p.no * tiles, tiles)
        for i in range(counts["comb"]):  # its (request, head group)'s splits
            out[base + st["comb"] + i] = span(k, "attn", i // p.nlc * p.nsplit, p.nsplit)
    for s in range(b.groups * ri):
        out[final_start(b) + s] = span(b.cfg.num_hidden_layers - 1, "post", s // ri * ri, ri)
    return out


def timeline_deps(b: DrafterBuild) -> dict[int, list[int]]:
    """Ticket -> every ticket whose output it reads: its `waits`, and for a row item the
    items whose pushes it polls for (post: its layer's oproj; norm and final: the layer
    before's down), which no done pair names. What `mono_runtime.timeline.critical_path`
    steps back through."""
    out, st, pl = waits(b), layer_starts(b), per_layer(b)
    counts = dict(layer_stages(b))
    layers, rows = b.cfg.num_hidden_layers, b.groups * b.plan.ri

    def pushes(k: int, stage: str) -> list[int]:
        return list(range(k * pl + st[stage], k * pl + st[stage] + counts[stage]))

    for k in range(layers + 1):
        for i in range(rows):
            if k < layers:
                post = k * pl + st["post"] + i
                out[post] = out.get(post, []) + pushes(k, "oproj")
            if k:
                t = final_start(b) + i if k == layers else k * pl + st["norm"] + i
                out[t] = out.get(t, []) + pushes(k - 1, "down")
    return out


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


def scratch_layout(b: DrafterBuild) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region of one build's scratch (this rank only). Row regions
    hold `tiles` x 16 rows: a dot tile may read past the last row, never past the region.

    done   pairs[tickets]: item t's (tag, 1) once it finished (tags: never zeroed)
    res    bf16[ROWS, H]   the residual
    xa     bf16[ROWS, H]   the attention input (input_layernorm)
    qkv    bf16[ROWS, QL + L + R]  fused_qkv_a's output; with K parts (qks > 1) fp32[qks,
           ROWS, QL + L + R], each part's sum
    qc     bf16[ROWS, QL]  q_a_layernorm's output
    q      bf16[ROWS, n (P + R)]  q_b's output
    qlat   bf16[n, ROWS, L]  the absorbed query
    qpe    bf16[n, ROWS, RP]  the roped query (columns past R zero)
    po     fp32[REQ, NHG, NSPLIT, QHR, L]  the splits' unnormalized outputs
    pm     fp32[REQ, NHG, NSPLIT, QHR]  their running maxima
    pl     fp32[REQ, NHG, NSPLIT, QHR]  their sums of exponentials
    lat    bf16[n, ROWS, L]  the attention output (latent)
    v      bf16[ROWS, n V]  o_proj's input
    xm     bf16[ROWS, H]   the MLP input (post_attention_layernorm)
    mid    bf16[ROWS, I]   act_and_mul's output
    gup    fp32[NGU, PASSES, GKS, 2 GB, PASS]  gate_up's K parts (none when GKS = 1)
    gcnt   int32[NGU, PASSES]  their arrival counts (dt.split_k: 0 between launches)
    dup    fp32[ND, PASSES, DKS, OC, PASS]  down's K parts (none when DKS = 1)
    dcnt   int32[ND, PASSES]  their arrival counts
    tot    fp32[ROWS, H]   a row norm's input (residual + reduced partials) between passes
    rss    fp32[GROUPS, RI, RB]  a row group's chunk items' sums of squares (RI > 1 only)
    rcnt   int32[GROUPS]   their arrival count (dt.last_arrival: 0 between launches)
    timeline  int64[tickets, 6] (timeline builds only): each item's program and SM, ticket,
           start, ready, end and mark (device ns; poll counts under the interpreter)
    """
    c, p = b.cfg, b.plan
    rows, n = b.tiles * TILE, c.local_heads
    h, lat = c.hidden_size, c.kv_lora_rank
    parts = b.requests * p.nhg * p.nsplit * p.qhr
    return _layout(
        [
            ("done", PAIR * tickets(b)),
            ("res", 2 * rows * h),
            ("xa", 2 * rows * h),
            ("qkv", (2 if p.qks == 1 else 4 * p.qks) * rows * c.qkv_a_rows),
            ("qc", 2 * rows * c.q_lora_rank),
            ("q", 2 * rows * c.q_b_rows),
            ("qlat", 2 * n * rows * lat),
            ("qpe", 2 * n * rows * p.rp),
            ("po", 4 * parts * lat),
            ("pm", 4 * parts),
            ("pl", 4 * parts),
            ("lat", 2 * n * rows * lat),
            ("v", 2 * rows * c.o_proj_in),
            ("xm", 2 * rows * h),
            ("mid", 2 * rows * c.local_intermediate),
            ("gup", 4 * p.ngu * p.gks * 2 * p.gb * rows if p.gks > 1 else 0),
            ("gcnt", 4 * p.ngu * rows // b.pass_rows if p.gks > 1 else 0),
            ("dup", 4 * p.no * p.dks * p.oc * rows if p.dks > 1 else 0),
            ("dcnt", 4 * p.no * rows // b.pass_rows if p.dks > 1 else 0),
            ("tot", 4 * rows * h),
            ("rss", 4 * b.groups * p.ri * p.rb if p.ri > 1 else 0),
            ("rcnt", 4 * b.groups if p.ri > 1 else 0),
        ]
        + ([("timeline", stamp_bytes(tickets(b)))] if b.timeline else [])
    )


def scratch_bytes(b: DrafterBuild) -> int:
    return _end(scratch_layout(b))


def peer_layout(cfg: DrafterConfig) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of each region in a rank's peer data (past the runtime's head),
    sized for the wide build's rows so that both builds share them.

    ar1  pairs[tp src][MAX_REQUESTS x query_len][H / 2]  bf16 pairs of the o_proj partials
    ar2  pairs[tp src][MAX_REQUESTS x query_len][H / 2]  bf16 pairs of the MLP partials

    One copy each: layers carry their own tags (module docstring), and consecutive
    launches are ordered on each rank's stream while every launch ends reading every
    peer's last `ar2` push, which that peer made after reading its last `ar1`.
    """
    rows = MAX_REQUESTS * cfg.query_len
    region = cfg.tp * rows * PAIR * (cfg.hidden_size // 2)
    return _layout([("ar1", region), ("ar2", region)])


def peer_bytes(cfg: DrafterConfig) -> int:
    return _end(peer_layout(cfg))


# -- arguments ---------------------------------------------------------------------------

LAYER_POINTERS = (
    "input_layernorm",
    "fused_qkv_a_proj",
    "q_a_layernorm",
    "kv_a_layernorm",
    "q_b_proj",
    "kv_b_proj",
    "o_proj",
    "post_attention_layernorm",
    "gate_up_proj",
    "down_proj",
    "k_scale",
    "q_scale",
    "cache",
)
"""Columns of the per-layer pointer table (int64 addresses): the layer's weights, then its
KV cache."""

ARGS: tuple[tuple[str, str], ...] = (
    ("embeds", "bf16[T, H] the block's token embeddings, request-major (T = requests x Q)"),
    ("positions", "int64[T] each row's position"),
    ("slot_mapping", "int64[T] each row's cache slot: negative = write nothing"),
    ("block_table", "int32[requests, >= pages] each request's KV blocks"),
    ("seq_lens", "int32[requests] context + block; 0 = a padding request"),
    ("out", "bf16[T, H] the final-normed hidden states (0 on padding requests)"),
    ("table", "int64[layers, len(LAYER_POINTERS)] the layers' weight and cache addresses"),
    ("final_norm", "bf16[H] the final norm's weight"),
    ("rope", "fp32[max_position_embeddings, R] cos then sin of each position"),
    ("scratch", "uint8 this build's scratch region (scratch_layout)"),
    ("nreq", "int32 the launch's requests (<= the build's)"),
    ("bt_stride", "int32 block_table's row stride"),
    ("slot", "int32 the launch's first tag slot; layer k tags with slot + k"),
)
"""Then mono_runtime's: ctl, health, tickets, peers, rank, world."""
