"""`mono bench ffn`: MiniMax-M3's FFN tail (seam, router, experts, shared expert, all-reduce)
at full per-rank shapes, through the kernel package's own benchmark function."""

from __future__ import annotations

import argparse
import importlib.util

from mono_tools.errors import CommandFailed
from mono_tools.machine import Machine

MAX_ROWS = 16  # the FFN builds serve widths 1..16


def measure(args: argparse.Namespace, machine: Machine):
    from mono_tools.errors import UsageError

    too_many = [r for r in args.rows if r > MAX_ROWS]
    if too_many:
        raise UsageError(f"--rows {too_many}: the FFN kernel serves at most {MAX_ROWS} rows")
    if importlib.util.find_spec("mono_kernels_minimax.ffn.bench") is None:
        raise CommandFailed(
            "this install has no FFN benchmark (mono_kernels_minimax.ffn.bench is absent)"
        )
    raise CommandFailed("mono_kernels_minimax.ffn.bench is present but not wired into mono yet")
