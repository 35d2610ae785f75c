"""A GPU smoke test: the device computes what the host computes, through the run script's path."""

import pytest


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_device_matmul_matches_host():
    import torch

    a = torch.randn(64, 64, dtype=torch.float64)
    b = torch.randn(64, 64, dtype=torch.float64)
    got = (a.cuda() @ b.cuda()).cpu()
    assert torch.allclose(got, a @ b, rtol=1e-12, atol=1e-12)
