"""Triton kernels for the peer-memory tests (imported only inside rank processes, so that
TRITON_INTERPRET can be set before triton is imported)."""

import triton
import triton.language as tl


@triton.jit
def put_rank(addresses, rank, value):
    """Program p stores ``value`` into int64 slot ``rank`` of peer p's buffer, through the
    address table alone."""
    peer = tl.program_id(0)
    base = tl.load(addresses + peer).to(tl.pointer_type(tl.int64))
    tl.store(base + rank, value)


def launch_put_rank(addresses, rank: int, value: int) -> None:
    put_rank[(addresses.numel(),)](addresses, rank, value)
