"""The tagged all-reduce's build key and layouts (PROTOCOL.md section 2 for the head).

Peer region, in every rank's data area at `peer_offset` (int64 pairs, bf16x2 payloads):

    [parity = slot & 1][source rank][row < rows][pair < hidden / 2]

Source r pushes its row block into every rank's [parity][r] rows; each rank sums sources
0..world-1 in order (fp32). Scratch at `scratch_offset`: [row][block] fp32 sum-of-squares
pairs (the norm's per-block partials).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import protocol as P


@dataclass(frozen=True)
class AllreduceBuild:
    """One compiled variant: rows x hidden bf16, `world` ranks, optional residual and norm."""

    rows: int
    hidden: int
    world: int
    residual: bool = False
    norm: bool = False
    block: int = 256  # pairs (2 columns each) per work item

    def __post_init__(self) -> None:
        if self.rows < 1 or self.hidden < 2 or self.hidden % 2:
            raise ValueError(f"allreduce: rows {self.rows} >= 1 and even hidden {self.hidden}")
        if not 1 <= self.world <= P.MAX_RANKS:
            raise ValueError(f"allreduce: world {self.world} not in 1..{P.MAX_RANKS}")
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"allreduce: block {self.block} must be a power of two")
        if self.norm and not self.residual:
            raise ValueError("allreduce: the norm variant needs the residual")

    @property
    def pairs(self) -> int:
        return self.hidden // 2

    @property
    def blocks(self) -> int:
        return -(-self.pairs // self.block)

    @property
    def items(self) -> int:
        return self.rows * self.blocks * (2 if self.norm else 1)

    @property
    def peer_bytes(self) -> int:
        return 2 * self.world * self.rows * self.pairs * 8

    @property
    def scratch_bytes(self) -> int:
        return self.rows * self.blocks * 8 if self.norm else 0

    @property
    def name(self) -> str:
        return f"allreduce[rows={self.rows},hidden={self.hidden},world={self.world}]"

    def rows_region(self) -> int:
        return P.region_id(f"{self.name} rows", self._where)

    def sumsq_region(self) -> int:
        return P.region_id(
            f"{self.name} sumsq",
            lambda pair: (
                f"row {pair // self.blocks} block {pair % self.blocks} sum of squares",
                None,
            ),
        )

    def _where(self, pair: int) -> tuple[str, int]:
        col = pair % self.pairs
        row = pair // self.pairs % self.rows
        src = pair // (self.pairs * self.rows) % self.world
        parity = pair // (self.pairs * self.rows * self.world)
        return f"from rank {src}, row {row}, columns {2 * col}.., parity {parity}", src
