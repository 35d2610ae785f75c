"""Hostile and careless inputs (issue 18): peer handles that are paths, a rank killed inside
the constructor, the test rendezvous store's address."""

from __future__ import annotations

import glob
import os
import signal
import time

import pytest
from mono_peer import PeerBuffer
from mono_peer.backends.host import HostBackend
from mono_peer.testing import spawn


def test_a_host_handle_that_is_a_path_is_refused(tmp_path):
    victim = tmp_path / "some-file"
    victim.write_bytes(b"\0" * 64)
    relative = os.path.relpath(victim, "/dev/shm")
    backend = HostBackend(64, 0)
    for handle in (f"mono-peer-x/../{relative}", f"mono-peer-1-r0-{'0' * 12}/..", b"mono-peer-1"):
        with pytest.raises(ValueError, match="not a host peer handle"):
            backend.open(handle)
    assert victim.read_bytes() == b"\0" * 64


def _die_in(stage: str) -> None:
    """Make this rank SIGKILL itself right after the host backend's `stage` step."""
    original = getattr(HostBackend, stage)

    def then_die(self, *args):
        result = original(self, *args)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(HostBackend, stage, then_die)


def _killed_in_constructor(rank, world, group, stage):
    import torch.distributed as dist

    pids: list = [None] * world
    dist.all_gather_object(pids, os.getpid(), group=group)
    if rank == 1:
        _die_in(stage)
    began = time.monotonic()
    try:
        PeerBuffer(64, group, rank, world, "cpu")
    except Exception as exc:  # the lost rank breaks the group's collectives
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = None
    return error, time.monotonic() - began, pids


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["allocate", "open"])
def test_a_rank_killed_in_the_constructor_leaves_no_segment(stage):
    survivor, lost = spawn(_killed_in_constructor, 2, 30, stage, may_die=(1,))
    assert lost is None
    error, seconds, pids = survivor
    assert error is not None and seconds < 20, (error, seconds)
    assert [glob.glob(f"/dev/shm/mono-peer-{pid}-*") for pid in pids] == [[], []]


def _listening_addresses(rank, world, group, parent_pid):
    """The local addresses of every TCP socket the parent listens on (hex, /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{parent_pid}/fd"):
        target = os.readlink(f"/proc/{parent_pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    found.append(fields[1].split(":")[0])
    return found


@pytest.mark.timeout(60)
def test_the_rendezvous_store_listens_on_loopback_only():
    (found,) = spawn(_listening_addresses, 1, 30, os.getpid())
    assert found and set(found) == {"0100007F"}, found
