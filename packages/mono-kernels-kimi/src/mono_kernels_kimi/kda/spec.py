"""K1's build key, work plan, scratch layout and argument list: pure Python, CPU-testable.

One launch runs a ticket loop over four stages of work items. An item waits only for the
items it reads (smaller tickets), so the launch cannot deadlock at any residency and runs
correctly when programs execute one after another:

    1 ares  per (row, hidden block): prefix (+ delta) -> bf16 prefix (in place), the block
            write, every source's partial sum of squares and qk dot (one load of all
            sources: a single latency)
    2 mix   per (row, hidden block), after stage 1's items of its row: softmax over the
            sources -> mixed (fp32), its partial sum of squares
    3 proj  per (BN in_proj rows, K part): weights the dot's wide operand in a pipelined
            fixed-count loop; x = the input RMSNorm of the mix, made in the loader (bf16,
            as `_attn_res_kernel` stores it). Items run head by head (f_a and beta rows
            first, then each head's q, k, v, g rows). Each K part writes fp32 partials; the
            last part of a row block to finish (a counter) sums them in part order ->
            bf16 proj (readers load it once, as the stock GEMM's output).
    4 head  per (head, request): NVC items of BV state rows each (f_b + lower-bound gate,
            conv (4) update + SiLU, l2norm, the delta rule token by token; a state per
            token to its slot; v channels' conv state), after the f_a/beta items and that
            head's items of stage 3; then one item that waits for those NVC: gated RMSNorm
            -> core out, q/k channels' conv state (after every reader of the old window).
            An item of the whole head (NVC = 1: `head_block_v` at 8+ requests) does its
            norm and the q/k conv state itself

The split-K counters sit at the head of the scratch region, at the same offset in every
build of a runner (its widths share one tiling), and are zero between launches: the last
part of a row block resets its counter.

A timeline build (`timeline=True`, for GPU tuning) also stamps each ticket's program,
start, ready and end into its scratch; its stages there are these four, with stage 4 split into
its state items ("head") and its gated-norm items ("norm"), whose costs differ by far, and
a final launch's TP fault handshake ("handshake") (`K1Build.stage_of`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mono_runtime.kernel.tiles import tile_overrides
from mono_runtime.timeline import stamp_bytes

from ..config import KimiK3Config

ROW_TILE = 16  # token rows on the narrow (N) side of every tl.dot tile (S padded up to it)
MAX_ROWS = ROW_TILE  # S = R x L rows a launch serves: every (R, L) with R x L <= 16
STAGE_NAMES = ("ares", "mix", "proj", "head")
TILES_ENV = "MONO_K1_TILES"  # e.g. "block_v=64,split_k=4": a benchmark's tile variant
ALIGN = 256

# Every argument of the Triton kernel before its constexprs, in launch order.
ARGS = (
    "prefix",
    "delta",
    "blocks",
    "ares_norm",
    "ares_qk",
    "in_norm",
    "in_proj",
    "f_b",
    "conv_w",
    "a_log",
    "dt_bias",
    "o_norm",
    "conv_state",
    "state",
    "state_indices",
    "num_accepted",
    "out",
    "scratch",
    "blocks_row_stride",
    "blocks_block_stride",
    "conv_slot_stride",
    "conv_dim_stride",
    "conv_pos_stride",
    "state_slot_stride",
    "indices_row_stride",
    "num_blocks",
    "write_idx",
    "num_slots",
    "eps",
    "out_eps",
    "o_norm_eps",
    "lower_bound",
)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pow2_at_most(n: int, cap: int) -> int:
    return 1 << (min(n, cap).bit_length() - 1)


def fit_tiling(cfg: KimiK3Config) -> dict:
    """Tile sizes that fit the model's sizes (the defaults of `K1Build.for_step`). A TP8
    rank of Kimi-K3 gets 28 AttnRes items a row and 200 proj items of 128 rows x 1792 K
    (1.5 a program on 132 SMs), 14 pipelined steps of 128 K each (twice the bytes in
    flight of 64-K steps: H100, stop 46, 62.8 / 68.8 / 70.6 / 83.0 -> 60.1 / 67.7 / 67.1 /
    82.1 us at S = 1 / 4 / 8 / 16; sm_90: no spills but 32 B at S = 4). H200 (stop 31): 8
    K parts (400 items, 3 waves) 68.4 / 121.2 / 196.4 us at S = 1 / 8 / 16, 4 parts 58.9 /
    113.2 / 188.4. Tiny models keep 64-K steps, so that the interpreter runs split K."""
    block_k = _pow2_at_most(cfg.hidden_size, 128 if cfg.hidden_size >= 2048 else 64)
    return dict(
        block_h=_pow2_at_most(cfg.hidden_size, 256),
        block_n=min(128, cfg.kda_head_dim),
        block_k=block_k,
        split_k=next(k for k in (4, 2, 1) if cfg.hidden_size % (k * block_k) == 0),
    )


def head_block_v(cfg: KimiK3Config, requests: int, programs: int) -> int:
    """State rows of a head item (block_v 0 in a tiling): the fewest items a step that
    still fill the programs once (requests x heads x head_dim / block_v <= programs), whole
    heads past that. Each item pays a latency chain (f_b's dot, q's and k's conv and
    l2norm) however few rows it has, so 16-row items at 16 requests (1536 + 192 norm items,
    ~12 a program) took 115 us of K1's 196; whole heads (192 items, each its own gated
    norm) 55 (H200, stop 31)."""
    d = cfg.kda_head_dim
    bv = min(16, d // 2)
    while bv < d and requests * cfg.local_heads * (d // bv) > programs:
        bv *= 2
    return bv


def ares_block_h(cfg: KimiK3Config, rows: int, programs: int) -> int:
    """Hidden columns of an AttnRes item (block_h 0 in a tiling): `fit_tiling`'s, doubled
    until a stage's items (rows x hidden / block_h) fit the programs once, at most 1024 (an
    item holds all its sources' columns in registers). Each item pays a load latency of
    every source whatever its width, so at 16 rows 448 + 448 items of 256 columns took
    36 us before proj could start. H200 (stop 32, us at 1 / 8 / 16 rows):
    256 columns 58.2 / 74.6 / 98.4, 512 57.8 / 68.9 / 81.6, 1024 61.4 / 70.5 / 76.8."""
    bh, top = fit_tiling(cfg)["block_h"], min(_pow2(cfg.hidden_size), 1024)
    while bh < top and rows * -(-cfg.hidden_size // bh) > programs:
        bh *= 2
    return bh


def proj_split_k(cfg: KimiK3Config, rows: int) -> int:
    """K parts of an in_proj row block (split_k 0 in a tiling): 2 at 1, 2 and 8 rows (100
    items of 3584 K), 4 at the other widths (200 of 1792); `fit_tiling`'s where it allows
    fewer. Measured, not derived: which wins follows how the head stage after proj is cut
    (`head_block_v`). H200 (stop 33, `k1-tune`, us at 1 / 4 / 8 / 16 rows): 2 parts
    55.1 / 67.2 / 62.8 / 80.2, 4 parts 59.0 / 60.6 / 66.1 / 72.8."""
    return min(2 if rows in (1, 2, 8) else 4, fit_tiling(cfg)["split_k"])


def tunable_tiling(cfg: KimiK3Config) -> dict:
    """`fit_tiling` with the AttnRes items' columns, the proj items' K parts and the head
    items' rows (0: `ares_block_h`, `proj_split_k` and `head_block_v` of each width), the
    proj loop's depth and the warps; at real widths each one the variable TILES_ENV names
    replaced (a benchmark's variant: GPU tuning without an edit)."""
    t = dict(
        fit_tiling(cfg),
        block_h=0,
        split_k=0,
        block_v=0,
        stages=K1Build.stages,
        num_warps=K1Build.num_warps,
        proj_pf=K1Build.proj_pf,
    )
    return tile_overrides(TILES_ENV, t) if cfg.hidden_size >= 2048 else t


@dataclass(frozen=True)
class K1Build:
    """Everything that changes K1's compiled code. Widths: rows = requests x L <= 16.

    Per-layer numbers that do not change the code (AttnRes sources, the block a
    block-write layer stores, epsilons, the gate bound) are launch arguments."""

    # model, per rank
    hidden: int
    heads: int  # local KDA heads
    head_dim: int
    f_a_dim: int
    in_proj_rows: int
    max_sources: int  # AttnRes blocks + 1 (sizes the partial-sum region)
    tp: int
    # step shape
    requests: int
    L: int
    spec: bool  # spec-verify (state_indices [R, L] + num_accepted) or plain decode
    # layer flags
    delta: bool  # a prefix delta to add (every layer after the first)
    write_block: bool  # a block-write layer: the updated prefix also goes to a block
    # tiling / launch
    programs: int = 132
    block_h: int = 256  # hidden columns of an AttnRes item
    block_n: int = 128  # in_proj rows of a proj item (divides head_dim: items are per head)
    block_k: int = 64  # K of one pipelined step of the proj loop
    split_k: int = 8  # K parts of a row block (hidden = split_k x steps x block_k)
    stages: int = 4  # software-pipeline depth of the proj loop
    # K columns of a proj item's rows asked of L2 before it waits for AttnRes (0: none;
    # NVIDIA's bulk prefetch): HBM streams them while the AttnRes stages run
    proj_pf: int = 0
    block_v: int = 16
    num_warps: int = 8
    timeline: bool = False  # stamp each item's program, ticket, start, ready, end, mark

    def __post_init__(self) -> None:
        if not 1 <= self.rows <= MAX_ROWS:
            raise ValueError(f"rows = requests x L = {self.rows} must be in 1..{MAX_ROWS}")
        if not self.spec and self.L != 1:
            raise ValueError("a plain-decode build has L = 1")
        for name in ("head_dim", "f_a_dim", "block_h", "block_n", "block_k", "block_v"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ValueError(f"{name} = {v} must be a power of two")
        if self.head_dim % self.block_v or self.block_n < 16 or self.block_k < 16:
            raise ValueError("block_v must divide head_dim; block_n, block_k >= 16")
        if self.head_dim < 16 or self.f_a_dim < 16:
            raise ValueError("head_dim and f_a_dim must be >= 16 (dot tiles)")
        if self.block_n > min(self.head_dim, 128):
            # a proj item's rows lie in one head's q, k, v or g (per-head hand-off), in
            # one 128-row dot tile
            raise ValueError(f"block_n = {self.block_n} must be <= min(head_dim, 128)")
        if self.split_k < 1 or self.hidden % (self.split_k * self.block_k):
            raise ValueError(
                f"hidden = {self.hidden} must be a multiple of split_k x block_k = "
                f"{self.split_k} x {self.block_k} (the proj loop has a fixed trip count)"
            )
        if self.stages < 1:
            raise ValueError(f"stages = {self.stages} must be >= 1")
        part = self.hidden // self.split_k
        if not 0 <= self.proj_pf <= part or self.proj_pf % 8:
            raise ValueError(
                f"proj_pf = {self.proj_pf}: a multiple of 8 columns in 0..{part} (a proj "
                "item's K part)"
            )

    @classmethod
    def for_step(
        cls,
        cfg: KimiK3Config,
        requests: int,
        L: int,
        *,
        spec: bool = True,
        delta: bool = True,
        write_block: bool = False,
        **tiling,
    ) -> K1Build:
        tiling = {**tunable_tiling(cfg), **tiling}
        programs = tiling.get("programs", cls.programs)
        if not tiling["block_h"]:
            tiling["block_h"] = ares_block_h(cfg, requests * L, programs)
        if not tiling["split_k"]:
            tiling["split_k"] = proj_split_k(cfg, requests * L)
        if not tiling["block_v"]:
            tiling["block_v"] = head_block_v(cfg, requests, programs)
        return cls(
            hidden=cfg.hidden_size,
            heads=cfg.local_heads,
            head_dim=cfg.kda_head_dim,
            f_a_dim=cfg.f_a_dim,
            in_proj_rows=cfg.in_proj_rows,
            max_sources=cfg.num_attn_res_blocks + 1,
            tp=cfg.tp,
            requests=requests,
            L=L,
            spec=spec,
            delta=delta,
            write_block=write_block,
            **tiling,
        )

    # ---- derived ----------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.requests * self.L

    @property
    def local_proj(self) -> int:
        return self.heads * self.head_dim

    @property
    def slices(self) -> int:
        return -(-self.hidden // self.block_h)

    @property
    def shared_blocks(self) -> int:
        """in_proj row blocks past q|k|v|g (f_a and beta): every head's items read them."""
        return -(-(self.in_proj_rows - 4 * self.local_proj) // self.block_n)

    @property
    def head_blocks(self) -> int:
        """in_proj row blocks of one head: its q, k, v and g rows."""
        return 4 * (self.head_dim // self.block_n)

    @property
    def proj_item_bytes(self) -> int:
        """Weight bytes one proj item streams."""
        return self.block_n * (self.hidden // self.split_k) * 2

    @property
    def head_items(self) -> int:
        """Items of one (head, request): its state items, then its gated norm's unless one
        item holds the whole head (it normalizes its own output then)."""
        nvc = self.head_dim // self.block_v
        return nvc + (nvc > 1)

    @property
    def stage_items(self) -> tuple[int, ...]:
        rc = self.rows * self.slices
        blocks = self.shared_blocks + self.heads * self.head_blocks
        head = self.requests * self.heads * self.head_items
        return (rc, rc, blocks * self.split_k, head)

    @property
    def total_items(self) -> int:
        return sum(self.stage_items)

    def tickets(self, final: bool) -> int:
        """Tickets of a launch: its items, then a final launch's TP fault handshake."""
        return self.total_items + int(final)

    def stage_of(self, ticket: int) -> str:
        """The timeline's stage of a ticket: the plan's, with stage 4's norm items apart."""
        if not 0 <= ticket <= self.total_items:
            raise ValueError(f"ticket {ticket}: a launch has tickets 0..{self.total_items}")
        per = self.head_items  # a (head, request)'s state items, then its norm (if apart)
        for name, n in zip(STAGE_NAMES, self.stage_items, strict=True):
            if ticket < n:
                return "norm" if name == "head" and per > 1 and ticket % per == per - 1 else name
            ticket -= n
        return "handshake"

    def scratch_layout(self) -> dict[str, tuple[int, int]]:
        """region -> (byte offset, bytes) inside this launch's scratch region."""
        S, H = self.rows, self.hidden
        blocks = self.shared_blocks + self.heads * self.head_blocks
        sizes = {
            "cnt": blocks * 4,
            "part": S * 2 * _pow2(self.max_sources) * _pow2(self.slices) * 4,
            "msq": S * _pow2(self.slices) * 4,
            "mixed": S * H * 4,
            "kparts": blocks * self.split_k * self.block_n * S * 4,
            "proj": S * self.in_proj_rows * 2,
            "o": S * self.local_proj * 2,
        }
        if self.timeline:  # int64 [tickets, STAMP_WORDS]: program, ticket, start, ready, end, mark
            sizes["timeline"] = stamp_bytes(self.tickets(True))
        out, off = {}, 0
        for name, n in sizes.items():
            out[name] = (off, n)
            off += -(-n // ALIGN) * ALIGN
        return out

    @property
    def scratch_bytes(self) -> int:
        return sum(-(-n // ALIGN) * ALIGN for _, n in self.scratch_layout().values())

    def key(self) -> tuple:
        return tuple(sorted(asdict(self).items()))
