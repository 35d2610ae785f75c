"""The drafter's KV splits under the CPU interpreter: the comb items read only the splits
that hold pages, so `_live_splits` must count exactly the splits `_split_pages` gives a
page, and those must be the first ones (a split it skips would drop attention mass)."""

from __future__ import annotations

import json
import sys

import pytest
import triton
import triton.language as tl
from mono_kernels_kimi.drafter.triton_build import _live_splits, _split_pages
from mono_peer.testing import child_json

BS = 16
SEQS = list(range(0, 70)) + [150, 1024, 1031, 8200, 32776]
NSPLITS = (1, 2, 3, 32)


@triton.jit
def _probe(seqs, live, pages, BS: tl.constexpr, NSPLIT: tl.constexpr):
    """Sequence i's live splits, and the pages each split gets."""
    i = tl.program_id(0)
    seq = tl.load(seqs + i)
    tl.store(live + i, _live_splits(seq, BS, NSPLIT))
    for j in tl.static_range(NSPLIT):
        p0, p1 = _split_pages(seq, j, BS, NSPLIT)
        tl.store(pages + i * NSPLIT + j, p1 - p0)


def interpreted() -> dict:
    import torch

    out = {}
    seqs = torch.tensor(SEQS, dtype=torch.int32)
    for n in NSPLITS:
        live = torch.zeros(len(SEQS), dtype=torch.int32)
        pages = torch.zeros(len(SEQS), n, dtype=torch.int32)
        _probe[(len(SEQS),)](seqs, live, pages, BS, n)
        out[str(n)] = {"live": live.tolist(), "pages": pages.tolist()}
    return out


@pytest.mark.timeout(200)
def test_live_splits_are_the_first_splits_with_pages():
    got, _ = child_json([__file__], 180, TRITON_INTERPRET="1")
    for n in NSPLITS:
        rows = zip(SEQS, got[str(n)]["live"], got[str(n)]["pages"], strict=True)
        for seq, live, pages in rows:
            held = [p > 0 for p in pages]
            assert held == [j < live for j in range(n)], (n, seq, live, pages)
            assert sum(max(p, 0) for p in pages) == -(-seq // BS), (n, seq, pages)  # all pages


if __name__ == "__main__":
    print(json.dumps(interpreted()))
    sys.stdout.flush()
