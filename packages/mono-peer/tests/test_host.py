"""Host backend, tp_agree and testing.spawn with real processes over a gloo group."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from pathlib import Path

import pytest
import torch
from mono_peer import PeerBuffer, tp_agree
from mono_peer.buffer import FAULT_ENV
from mono_peer.testing import spawn

SLOT = 8  # one int64 word per rank


def _mapped_segments() -> list[str]:
    """Lines of this process's memory map that still reference a host peer segment."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "/dev/shm/mono-peer-" in line]


def _peer_words(address: int, count: int) -> torch.Tensor:
    """A torch view of ``count`` int64 words at a raw address (proves the address is right)."""
    return torch.frombuffer((ctypes.c_int64 * count).from_address(address), dtype=torch.int64)


def _write_read(rank, world, group, through_triton):
    import torch.distributed as dist

    with PeerBuffer(world * SLOT, group, rank, world, "cpu") as buf:
        assert buf.backend == "host"
        assert buf.addresses.dtype == torch.int64 and buf.addresses.device.type == "cpu"
        assert buf.addresses.tolist()[rank] == buf.local
        assert buf.bytes.numel() == world * SLOT and not buf.bytes.any()  # zeroed
        unlinked = not glob.glob(f"/dev/shm/mono-peer-{os.getpid()}-*")
        dist.barrier(group)  # every rank checked its zeros before anyone writes
        value = 100 + rank
        if through_triton:
            kernels = _sibling("peer_kernels")
            kernels.launch_put_rank(buf.addresses, rank, value)
        else:
            for address in buf.addresses.tolist():
                ctypes.c_int64.from_address(address + SLOT * rank).value = value
        dist.barrier(group)
        own = buf.bytes.view(torch.int64).tolist()
        seen = [_peer_words(a, world).tolist() for a in buf.addresses.tolist()]
        dist.barrier(group)  # nobody unmaps while a peer still reads
    return own, seen, unlinked, _mapped_segments()


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "world, start_method", [(1, "spawn"), (1, "forkserver"), (2, "forkserver"), (4, "forkserver")]
)
def test_every_rank_writes_every_peer_through_addresses(world, start_method):
    expected = [100 + r for r in range(world)]
    results = spawn(_write_read, world, 45, False, start_method=start_method)
    for own, seen, unlinked, mapped in results:
        assert own == expected
        assert seen == [expected] * world
        assert unlinked, "a segment outlived the exchange"
        assert mapped == [], "a mapping outlived close()"


@pytest.mark.timeout(90)
def test_triton_interpreter_stores_through_peer_addresses():
    results = spawn(_write_read, 2, 75, True, env={"TRITON_INTERPRET": "1"})
    for own, seen, _, _ in results:
        assert own == [100, 101]
        assert seen == [[100, 101]] * 2


def _faults(rank, world, group):
    messages = {}
    for stage in ("alloc", "map"):
        os.environ[FAULT_ENV] = f"{stage}:1"
        try:
            PeerBuffer(64, group, rank, world, "cpu")
        except RuntimeError as exc:
            messages[stage] = str(exc)
        leftovers = glob.glob(f"/dev/shm/mono-peer-{os.getpid()}-*"), _mapped_segments()
        messages[stage + " leftovers"] = leftovers
    del os.environ[FAULT_ENV]
    with PeerBuffer(64, group, rank, world, "cpu") as buf:  # the group is still usable
        healthy = buf.addresses.numel()
    agreed = tp_agree(True, group), tp_agree(rank != 2, group)
    return messages, healthy, os.getpid(), agreed


@pytest.mark.timeout(60)
def test_a_failing_rank_makes_every_rank_raise_and_leak_nothing():
    world = 3
    results = spawn(_faults, world, 45)
    for rank, (messages, healthy, pid, agreed) in enumerate(results):
        assert agreed == (True, False)  # tp_agree is a MIN over ranks
        for stage in ("alloc", "map"):
            text = messages.get(stage)
            assert text is not None, f"rank {rank} did not raise for a {stage} fault"
            if rank == 1:
                assert "this rank (rank 1 of 3) failed" in text
                assert "injected fault" in text
            else:
                assert "another rank failed" in text
            assert messages[stage + " leftovers"] == ([], [])
        assert "could not allocate" in messages["alloc"] or rank != 1
        assert healthy == world
        assert not glob.glob(f"/dev/shm/mono-peer-{pid}-*")
    assert "rank(s) [1] could not allocate" in results[0][0]["alloc"]


def _argument_errors(rank, world, group):
    other = 1 - rank
    cases = {
        "nbytes 0": dict(nbytes=0),
        "npes wrong": dict(npes=3),
        "rank out of range": dict(rank=5),
        "rank swapped": dict(rank=other),
        "only rank 0 bad": dict(nbytes=0 if rank == 0 else 64),
        "nbytes differ": dict(nbytes=64 * (rank + 1)),
        "host on cuda": dict(device="cuda"),
        "cuda on cpu": dict(backend="cuda"),
        "unknown backend": dict(backend="nvshmem"),
    }
    seen = {}
    for name, change in cases.items():
        kwargs = dict(nbytes=64, group=group, rank=rank, npes=world, device="cpu") | change
        if name == "host on cuda":
            kwargs["backend"] = "host"
        try:
            PeerBuffer(**kwargs).close()
            seen[name] = "no error"
        except Exception as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    with PeerBuffer(64, group, rank, world, "cpu"):
        pass
    return seen


@pytest.mark.timeout(60)
def test_argument_errors_raise_value_error_on_every_rank():
    results = spawn(_argument_errors, 2, 45)
    for name in results[0]:
        for rank in range(2):
            assert results[rank][name].startswith("ValueError: PeerBuffer: "), (name, rank)
    assert "rank=1 but this process is rank 0" in results[0]["rank swapped"]
    assert "nbytes must be a positive int" in results[0]["only rank 0 bad"]
    assert "another rank's arguments are invalid" in results[1]["only rank 0 bad"]
    assert "nbytes differs between ranks (64 to 128)" in results[0]["nbytes differ"]
    assert "needs a cpu device" in results[0]["host on cuda"]


def test_tp_agree_single_rank():
    assert tp_agree(True, None) and not tp_agree(False, None)


def test_single_rank_close_is_idempotent_and_use_after_close_raises():
    buf = PeerBuffer(128, None, 0, 1, "cpu")
    assert buf.addresses.tolist() == [buf.local]
    buf.bytes[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert _peer_words(buf.local, 1).item() == 0x04030201
    assert _mapped_segments()
    buf.close()
    buf.close()
    assert buf.closed and not _mapped_segments()
    for name in ("addresses", "local", "bytes"):
        with pytest.raises(RuntimeError, match="PeerBuffer is closed"):
            getattr(buf, name)
    with PeerBuffer(8, None, 0, 1, torch.device("cpu"), backend="host") as other:
        assert "rank 0 of 1" in repr(other)
    assert other.closed


def test_single_rank_argument_errors():
    with pytest.raises(ValueError, match="npes=2 but no group"):
        PeerBuffer(8, None, 0, 2, "cpu")
    with pytest.raises(ValueError, match="nbytes must be a positive int"):
        PeerBuffer(-1, None, 0, 1, "cpu")
    with pytest.raises(ValueError, match="nbytes must be a positive int"):
        PeerBuffer(True, None, 0, 1, "cpu")


def _boom(rank, world, group):
    if rank == 1:
        raise KeyError("rank one fails")
    import torch.distributed as dist

    dist.barrier(group)  # would wait for rank 1 forever: spawn must kill it


@pytest.mark.timeout(60)
def test_spawn_reports_every_rank_and_kills_the_stuck_ones():
    with pytest.raises(AssertionError) as info:
        spawn(_boom, 2, 30)
    text = str(info.value)
    assert "rank 1: raised" in text and "KeyError: 'rank one fails'" in text
    assert "rank 0: killed" in text or "rank 0: raised" in text


def _sleepy(rank, world, group):
    import time

    time.sleep(60)


@pytest.mark.timeout(60)
def test_spawn_times_out():
    with pytest.raises(AssertionError, match="rank 0: killed"):
        spawn(_sleepy, 1, 3)


def _dies_or_returns_junk(rank, world, group):
    if rank == 0:
        os._exit(3)
    return lambda: None  # cannot be pickled back to the parent


@pytest.mark.timeout(60)
def test_spawn_reports_a_dead_rank_and_an_unpicklable_result():
    with pytest.raises(AssertionError) as info:
        spawn(_dies_or_returns_junk, 2, 30)
    text = str(info.value)
    assert "rank 0: died with exit code 3 before reporting" in text
    assert "rank 1: raised" in text and "pickle" in text
