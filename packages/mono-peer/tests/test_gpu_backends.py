"""cuda and hip backends: what a CPU can check (bindings, error paths), and GPU runs.

GPU tests (marker ``gpu``) run two ranks as processes on one GPU: each writes into the
other's buffer through the address table (a Triton kernel) and through a torch view of
the peer's mapping, then reads what the peer wrote. Two contexts on one GPU time-slice,
so this checks function, not speed. The ``rocm`` tests are the same on an AMD GPU (the
hip backend); no AMD GPU was available to run them.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from mono_peer import PeerBuffer
from mono_peer.backends import hip
from mono_peer.buffer import FAULT_ENV
from mono_peer.testing import spawn

SLOT = 8


def test_hip_backend_imports_without_rocm_and_matches_the_c_layout():
    assert ctypes.sizeof(hip.HipIpcMemHandle) == 64
    assert hip.HIP_DEVICE_MALLOC_UNCACHED == 0x3
    assert hip.HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == 0x1
    assert "hipExtMallocWithFlags" in hip._SIGNATURES
    handle = hip.HipIpcMemHandle.from_buffer_copy(bytes(range(64)))
    assert bytes(handle) == bytes(range(64))


def test_hip_finds_the_runtime_torch_loaded(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /venv/torch/lib/libamdhip64.so.6\n"
        "7f04-7f05 rw-p 00000000 00:00 0\n"
    )
    assert hip.loaded_library_path(str(maps)) == "/venv/torch/lib/libamdhip64.so.6"
    maps.write_text("7f04-7f05 rw-p 00000000 00:00 0\n")
    assert hip.loaded_library_path(str(maps)) == "libamdhip64.so"


def test_cuda_handle_bytes_round_trip_through_the_bindings_struct():
    from mono_peer.backends.cuda import IPC_HANDLE_SIZE, _runtime

    rt = _runtime()
    handle = rt.cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), bytes(range(IPC_HANDLE_SIZE)), IPC_HANDLE_SIZE)
    assert ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE) == bytes(range(IPC_HANDLE_SIZE))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path of a GPU-less host")
def test_cuda_backend_without_a_gpu_raises_runtime_error_naming_this_rank():
    with pytest.raises(RuntimeError, match=r"this rank \(rank 0 of 1\) failed: could not allocate"):
        PeerBuffer(64, None, 0, 1, "cuda")


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpu_exchange(rank, world, group):
    """Slot r of every buffer gets 100 + r from a Triton store through the address table;
    slot world + r gets 200 + r from a torch op on this rank's view of the peer's buffer."""
    import torch.distributed as dist

    kernels = _sibling("peer_kernels")
    with PeerBuffer(2 * world * SLOT, group, rank, world, "cuda:0") as buf:
        assert buf.addresses.device.type == "cuda"
        assert not buf.bytes.any().item()  # zeroed once at construction
        dist.barrier(group)
        kernels.launch_put_rank(buf.addresses, rank, 100 + rank)
        for peer in range(world):
            buf.peer(peer).view(torch.int64)[world + rank] = 200 + rank
        torch.cuda.synchronize()
        dist.barrier(group)
        own = buf.bytes.view(torch.int64).tolist()
        backend = buf.backend
        dist.barrier(group)  # nobody frees while a peer still maps it
    return own, backend


def _expected(world):
    return [100 + r for r in range(world)] + [200 + r for r in range(world)]


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_gpu_two_ranks_on_one_gpu_write_each_other():
    for own, _ in spawn(_gpu_exchange, 2, 200):
        assert own == _expected(2)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_single_rank():
    [(own, backend)] = spawn(_gpu_exchange, 1, 100)
    assert own == _expected(1)
    assert backend == ("hip" if torch.version.hip else "cuda")


def _gpu_fault(rank, world, group):
    import os

    os.environ[FAULT_ENV] = "map:1"
    failed = "no error"
    try:
        PeerBuffer(4096, group, rank, world, "cuda:0")
    except RuntimeError as exc:
        failed = str(exc)
    del os.environ[FAULT_ENV]
    with PeerBuffer(4096, group, rank, world, "cuda:0") as buf:  # nothing stranded
        healthy = buf.addresses.numel()
        torch.cuda.synchronize()
        import torch.distributed as dist

        dist.barrier(group)
    return failed, healthy


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_gpu_failed_mapping_raises_on_every_rank_and_recovers():
    results = spawn(_gpu_fault, 2, 200)
    assert "another rank failed" in results[0][0]
    assert "this rank (rank 1 of 2) failed" in results[1][0]
    assert [healthy for _, healthy in results] == [2, 2]


@pytest.mark.rocm
@pytest.mark.timeout(240)
def test_rocm_hip_backend_two_ranks():
    for own, backend in spawn(_gpu_exchange, 2, 200):
        assert backend == "hip"
        assert own == _expected(2)


@pytest.mark.rocm
def test_rocm_hip_allocates_uncached_memory_with_a_handle():
    buf = PeerBuffer(256, None, 0, 1, "cuda")
    try:
        assert buf.backend == "hip" and buf.local != 0
        assert not buf.bytes.any().item()
    finally:
        buf.close()
    with pytest.raises(RuntimeError, match="PeerBuffer is closed"):
        _ = buf.addresses


@pytest.fixture
def fake_hip(tmp_path, monkeypatch):
    """The hip backend bound to tests/fake_hip.c (same C signatures, host memory)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake HIP runtime")
    library = tmp_path / "libamdhip64.so"
    source = Path(__file__).with_name("fake_hip.c")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", library, source], check=True)
    monkeypatch.setattr(hip, "loaded_library_path", lambda: str(library))
    monkeypatch.setattr(hip.torch.cuda, "init", lambda: None)
    monkeypatch.setattr(hip.torch.cuda, "device", lambda device: contextlib.nullcontext())
    hip._hip.cache_clear()
    yield hip.HipBackend(64, torch.device("cuda", 0))
    hip._hip.cache_clear()


def test_hip_bindings_against_a_fake_runtime(fake_hip):
    address, handle = fake_hip.allocate()  # uncached flag, zeroed, 64-byte handle
    assert len(handle) == 64 and handle.startswith(b"fakehip")
    assert ctypes.string_at(address, 64) == bytes(64)
    assert fake_hip.open(handle) == address  # handle passed by value, lazy-peer flag
    fake_hip.close_peer(address)
    fake_hip.free(address)
    with pytest.raises(RuntimeError, match=r"hipFree failed: hipErrorInvalidDevicePointer"):
        fake_hip.free(address)
    with pytest.raises(ValueError, match="not a HIP IPC handle"):
        fake_hip.open(b"short")
