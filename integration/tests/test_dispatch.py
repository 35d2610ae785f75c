"""The per-layer dispatch inside a stock layer loop (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch
from mono_vllm import dispatch


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4, bias=False)

    def forward(self, positions, hidden, residual):
        return self.proj(hidden), residual


class Backbone(torch.nn.Module):
    """A stock layer loop, as vLLM's models write it."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(3))

    def forward(self, hidden):
        residual = hidden
        for layer in self.layers:
            hidden, residual = layer(None, hidden, residual)
        return hidden


class Source:
    def __init__(self):
        self.kernels: dict[int, object] = {}

    def layer(self, index):
        return self.kernels.get(index)


def test_layers_run_the_plan_or_their_own_forward():
    torch.manual_seed(0)
    model, source = Backbone(), Source()
    x = torch.randn(2, 4)
    stock = model(x)
    names = [n for n, _ in model.named_parameters()]
    dispatch.install(model.layers[1], 1, source)
    assert isinstance(model.layers[1], Layer) and type(model.layers[1]).__name__ == "MonoLayer"
    assert [n for n, _ in model.named_parameters()] == names
    assert torch.equal(model(x), stock)  # no kernel planned: vLLM's forward

    calls = []

    def kernel(positions, hidden, residual):
        calls.append(hidden.shape)
        return hidden * 0 + 1, residual

    source.kernels[1] = kernel
    out = model(x)
    assert calls == [(2, 4)]
    assert torch.equal(out, model.layers[2](None, torch.ones(2, 4), x)[0])

    with pytest.raises(RuntimeError, match="already dispatches"):
        dispatch.install(model.layers[1], 1, source)
    dispatch.uninstall(model.layers[1])
    assert type(model.layers[1]) is Layer and not hasattr(model.layers[1], "_mono_source")
    assert torch.equal(model(x), stock)
