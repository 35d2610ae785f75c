"""Repo-wide pytest hooks: hardware markers skip, with a reason, where the hardware is absent.

The markers themselves are registered once, in the root pyproject.toml.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _gpus() -> tuple[int, bool]:
    """(visible GPUs, whether they are AMD ones) as torch sees them; (0, False) without torch."""
    try:
        import torch
    except ImportError:
        return 0, False
    if not torch.cuda.is_available():
        return 0, False
    return torch.cuda.device_count(), torch.version.hip is not None


def _skip_reason(item: pytest.Item) -> str | None:
    count, hip = _gpus()
    if "rocm" in item.keywords and not (count and hip):
        return "needs an AMD GPU with ROCm (marker rocm): none visible to torch"
    if "multigpu" in item.keywords and count < 2:
        return f"needs 2+ GPUs of one host (marker multigpu): torch sees {count}"
    if "gpu" in item.keywords and not count:
        return "needs an NVIDIA or AMD GPU (marker gpu): torch sees none"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = _skip_reason(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
