"""Backend and rank choices are refused up front, with the reason, on any machine."""

import pytest
from mono_tools.errors import UsageError
from mono_tools.machine import Machine, resolve_backend, resolve_ranks

CPU = Machine(gpus=0, vendor=None, gpu_name=None, cpus=2, torch="x", triton=None)
H200 = Machine(gpus=1, vendor="cuda", gpu_name="NVIDIA H200", cpus=16, torch="x", triton="y")


def test_auto_picks_the_gpu_vendor_or_the_host():
    assert resolve_backend("auto", CPU) == "host"
    assert resolve_backend("auto", H200) == "cuda"
    assert resolve_backend("host", H200) == "host"


def test_a_backend_the_machine_lacks():
    with pytest.raises(UsageError, match="machine's GPUs are cuda"):
        resolve_backend("hip", H200)


def test_ranks_per_gpu():
    assert resolve_ranks(None, "cuda", H200, host_default=2) == 1
    assert resolve_ranks(None, "host", H200, host_default=2) == 2
    assert resolve_ranks(5, "host", CPU, host_default=2) == 5
    with pytest.raises(UsageError, match="--ranks 2 needs 2 GPUs .* torch sees 1"):
        resolve_ranks(2, "cuda", H200, host_default=2)
