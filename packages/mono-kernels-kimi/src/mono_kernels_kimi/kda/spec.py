"""K1's build key, work plan, scratch layout and argument list: pure Python, CPU-testable.

One launch runs a ticket loop over six stages of work items; a stage's items wait only
for whole earlier stages (smaller tickets), so the launch cannot deadlock at any
residency and runs correctly when programs execute one after another:

    1 ares   per hidden slice: prefix (+ delta) -> bf16 prefix (in place), the block
             write, per-source partial sum of squares and qk dot
    2 mix    per hidden slice: softmax over the sources -> mixed row slice (fp32), its
             partial sum of squares
    3 x      per hidden slice: input RMSNorm -> bf16 x
    4 proj   per BN in_proj rows: x @ in_proj^T -> bf16 q|k|v|g|f_a|beta
    5 kda    per (request, head, BV state rows): f_b + lower-bound gate, conv (4) update
             + SiLU, l2norm, the delta rule token by token (a state per token to its
             slot), v channels' conv state
    6 norm   per (request, head): gated RMSNorm -> core out, q/k channels' conv state
             (written after every stage-5 item has read the old window)

The control words (ticket, exits, per-stage done counts, error bits) sit at the head of
the scratch region and are zero between launches: the last program out resets them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import KimiK3Config

MAX_ROWS = 8  # S = R x L rows a launch serves: the x rows of a step fit one dot tile
ROW_TILE = 16  # rows of every tl.dot tile (S is padded up to it)
CTRL_WORDS = 32  # int32 control words at the head of the scratch region
TICKET, EXITS, DONE0, ERROR = 0, 1, 2, 9  # DONE0 + stage (0..5)
STAGES = ("ares", "mix", "x", "proj", "kda", "norm")
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


@dataclass(frozen=True)
class K1Build:
    """Everything that changes K1's compiled code. Widths: rows = requests x L <= 8.

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
    block_h: int = 512
    block_n: int = 32
    block_k: int = 256
    block_v: int = 16
    num_warps: int = 8
    max_polls: int = 1 << 24
    # in_proj items that stream their rows into L2 while the AttnRes stages run (0: off);
    # keep prefetch_items x block_n x hidden x 2 bytes well under the L2 size
    prefetch_items: int = 0

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
    def stage_items(self) -> tuple[int, ...]:
        c = self.slices
        kda = self.requests * self.heads * (self.head_dim // self.block_v)
        return (c, c, c, -(-self.in_proj_rows // self.block_n), kda, self.requests * self.heads)

    @property
    def total_items(self) -> int:
        return sum(self.stage_items)

    def scratch_layout(self) -> dict[str, tuple[int, int]]:
        """region -> (byte offset, bytes) inside this launch's scratch region."""
        S, H = self.rows, self.hidden
        sizes = {
            "ctrl": CTRL_WORDS * 4,
            "part": S * self.max_sources * _pow2(self.slices) * 2 * 4,
            "msq": S * _pow2(self.slices) * 4,
            "mixed": S * H * 4,
            "x": S * H * 2,
            "proj": S * self.in_proj_rows * 2,
            "o": S * self.local_proj * 2,
        }
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
