"""PeerBuffer: one buffer per rank, mapped by every rank, built collectively.

Construction is collective over a CPU process group and keeps every rank on one path:
arguments are agreed first (so a rank with a bad argument raises together with the
others instead of stranding them), then handles are exchanged, peers opened, and
``tp_agree`` decides whether every rank mapped every peer. On any failure every rank
unmaps and frees what it made and raises.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .agree import agree_min, tp_agree
from .backends import Backend, default_backend, device_problem, make_backend

FAULT_ENV = "MONO_PEER_FAULT"
"""Test hook: "alloc:<rank>" or "map:<rank>" makes that rank fail that stage (after it
has opened every peer, for "map", so the clean-up of real mappings is exercised)."""


def _inject(stage: str, rank: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec == f"{stage}:{rank}":
        raise OSError(f"injected fault ({FAULT_ENV}={spec})")


def _group_shape(group: Any) -> tuple[int, int]:
    """(size, this process's rank) of ``group``; (1, 0) for None."""
    if group is None:
        return 1, 0
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group)


def _argument_problem(
    nbytes: Any, rank: Any, npes: Any, device: torch.device, backend: str, group: Any
) -> str | None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 < nbytes < 2**62:
        return f"nbytes must be a positive int (below 2**62), got {nbytes!r}"
    if isinstance(npes, bool) or not isinstance(npes, int) or npes <= 0:
        return f"npes must be a positive int, got {npes!r}"
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < npes:
        return f"rank must be an int in [0, {npes}), got {rank!r}"
    size, group_rank = _group_shape(group)
    if npes != size:
        what = "no group (one rank)" if group is None else f"a group of {size} ranks"
        return f"npes={npes} but {what} was given"
    if rank != group_rank:
        return f"rank={rank} but this process is rank {group_rank} of the group"
    return device_problem(backend, device)


def _exchange(handle: bytes | str | None, npes: int, group: Any) -> list[bytes | str | None]:
    if group is None:
        return [handle]
    import torch.distributed as dist

    handles: list[Any] = [None] * npes
    dist.all_gather_object(handles, handle, group=group)
    return handles


class PeerBuffer:
    """``nbytes`` of peer memory on ``device`` for rank ``rank`` of ``npes``.

    ``group`` is a CPU (gloo) process group, or None for a single rank. ``backend`` is
    "cuda", "hip" or "host"; by default the device picks it (cpu -> host).
    """

    def __init__(
        self,
        nbytes: int,
        group: Any,
        rank: int,
        npes: int,
        device: torch.device | str,
        backend: str | None = None,
    ) -> None:
        self._closed = True  # until every rank has mapped every peer
        device = torch.device(device)
        name = backend if backend is not None else default_backend(device)
        problem = _argument_problem(nbytes, rank, npes, device, name, group)
        self._agree_arguments(problem, nbytes, group)
        self.nbytes, self.rank, self.npes, self.device = nbytes, rank, npes, device
        self._name = name
        self._backend: Backend | None = None
        self._local: int | None = None
        self._peers: dict[int, int] = {}
        self._addresses: torch.Tensor | None = None
        self._bytes: torch.Tensor | None = None
        self._build(group)
        self._closed = False

    @staticmethod
    def _agree_arguments(problem: str | None, nbytes: Any, group: Any) -> None:
        size = nbytes if problem is None else 0
        if group is None:
            if problem:
                raise ValueError(f"PeerBuffer: {problem}")
            return
        ok, low, neg_high = agree_min([problem is None, size, -size], group)
        if problem:
            raise ValueError(f"PeerBuffer: {problem}")
        if not ok:
            raise ValueError("PeerBuffer: another rank's arguments are invalid (see its error)")
        if low != -neg_high:
            raise ValueError(f"PeerBuffer: nbytes differs between ranks ({low} to {-neg_high})")

    def _build(self, group: Any) -> None:
        """Reserve, allocate, exchange, open, agree; on failure release on every rank and
        raise. Reservations are exchanged before anything exists, so the survivors of a rank
        killed mid-way remove what it left (a host segment)."""
        error: str | None = None
        handle: bytes | str | None = None
        reserved: str | None = None
        try:
            self._backend = make_backend(self._name, self.nbytes, self.device, self.rank)
            self.device = self._backend.device
            reserved = self._backend.reserve()
        except Exception as exc:  # reported on every rank through the agreement below
            error = self._cannot_allocate(exc)
        names: list[str | None] = []
        try:
            names = _exchange(reserved, self.npes, group)
            if error is None:
                error, handle = self._allocate()
            handles = _exchange(handle, self.npes, group)
            missing = [r for r, h in enumerate(handles) if h is None]
            if error is None and not missing:
                error = self._open_peers(handles)
            ok = tp_agree(error is None and not missing, group)
        except BaseException:  # a collective broke (a rank died): nobody will free for it
            self._release(None)
            if self._backend is not None:
                self._backend.remove(names)
            raise
        if ok:
            self._backend.exchanged()
            return
        self._release(group)
        where = f"rank {self.rank} of {self.npes}"
        if error is not None:
            raise RuntimeError(f"PeerBuffer: this rank ({where}) failed: {error}")
        who = f"rank(s) {missing} could not allocate" if missing else "it could not map a peer"
        raise RuntimeError(
            f"PeerBuffer: another rank failed ({who}); this rank ({where}) released its buffer"
        )

    def _cannot_allocate(self, exc: Exception) -> str:
        """The error of a rank whose backend set-up or allocation failed."""
        return f"could not allocate {self.nbytes} bytes ({self._name}): {exc}"

    def _allocate(self) -> tuple[str | None, bytes | str | None]:
        """(None, handle) with the local buffer allocated, or (why not, None)."""
        try:
            _inject("alloc", self.rank)
            self._local, handle = self._backend.allocate()
        except Exception as exc:
            return self._cannot_allocate(exc), None
        return None, handle

    def _open_peers(self, handles: list[bytes | str | None]) -> str | None:
        for peer, handle in enumerate(handles):
            if peer == self.rank:
                continue
            try:
                self._peers[peer] = self._backend.open(handle)
            except Exception as exc:
                return f"could not map rank {peer}'s buffer ({self._backend.name}): {exc}"
        try:
            _inject("map", self.rank)
            table = [self._peers.get(r, self._local) for r in range(self.npes)]
            self._addresses = torch.tensor(table, dtype=torch.int64, device=self.device)
            self._bytes = self._backend.view(self._local)
        except Exception as exc:
            return f"could not map its peers: {exc}"
        return None

    def _release(self, group: Any) -> None:
        """Unmap every peer, then free the local buffer; raise once, after trying all.

        With ``group``, every rank unmaps before any rank frees (freeing memory that a peer
        still maps is undefined behaviour for CUDA and HIP IPC).
        """
        errors = []
        for peer, address in sorted(self._peers.items()):
            try:
                self._backend.close_peer(address)
            except Exception as exc:
                errors.append(f"rank {peer}'s mapping: {exc}")
        self._peers.clear()
        self._addresses = self._bytes = None
        if group is not None:
            tp_agree(True, group)
        if self._backend is not None:
            self._backend.exchanged()
        if self._local is not None:
            try:
                self._backend.free(self._local)
            except Exception as exc:
                errors.append(f"local buffer: {exc}")
            self._local = None
        if errors:
            raise RuntimeError("PeerBuffer: release failed: " + "; ".join(errors))

    def _live(self) -> None:
        if self._closed:
            raise RuntimeError("PeerBuffer is closed")

    @property
    def backend(self) -> str:
        return self._name

    @property
    def addresses(self) -> torch.Tensor:
        """int64 [npes] on the device: every rank's buffer address as this process sees it."""
        self._live()
        return self._addresses

    @property
    def local(self) -> int:
        """This rank's buffer address."""
        self._live()
        return self._local

    @property
    def bytes(self) -> torch.Tensor:
        """A non-owning uint8 view of the local buffer; invalid once the buffer is closed."""
        self._live()
        return self._bytes

    def peer(self, rank: int) -> torch.Tensor:
        """A non-owning uint8 view of rank ``rank``'s buffer as mapped in this process."""
        self._live()
        if not 0 <= rank < self.npes:
            raise ValueError(f"PeerBuffer.peer: rank must be in [0, {self.npes}), got {rank}")
        address = self._local if rank == self.rank else self._peers[rank]
        return self._backend.view(address)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap every peer and free the local buffer. Local (not collective); idempotent.

        Peers may still be writing into this rank's buffer: synchronize the ranks first.
        """
        if self._closed:
            return
        self._closed = True
        self._release(None)

    def __enter__(self) -> PeerBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"local=0x{self._local:x}"
        return (
            f"PeerBuffer({self.nbytes} bytes, rank {self.rank} of {self.npes}, "
            f"{self.backend} on {self.device}, {state})"
        )
