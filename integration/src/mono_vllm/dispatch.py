"""Decoder layers that ask the executor, each call, whether a kernel replaces them.

vLLM's stock layer loop (``for layer in self.layers: ... = layer(...)``) has no public
hook per layer, and neither model builds its decoder layers through anything we can
substitute. So once the weights are loaded, each decoder layer that a kernel can replace
gets its class swapped for a subclass of its own class whose ``forward`` runs
``executor.layer(i)`` when the step's plan has one and vLLM's ``forward`` otherwise, the
way ``torch.nn.utils.parametrize`` swaps a module's class. The module keeps its identity,
parameters, names, hooks and every ``isinstance`` answer; nothing else of vLLM changes.
This is the one in-place change the plugin makes to vLLM objects.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Protocol

import torch


class LayerSource(Protocol):
    def layer(self, index: int) -> Any:
        """The callable replacing decoder layer `index` in this step, or None."""


@cache
def _dispatching(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    def forward(self, *args, **kwargs):
        kernel = self._mono_source.layer(self._mono_index)
        if kernel is None:
            return cls.forward(self, *args, **kwargs)
        return kernel(*args, **kwargs)

    return type(f"Mono{cls.__name__}", (cls,), {"forward": forward, "_mono_stock": cls})


def install(layer: torch.nn.Module, index: int, source: LayerSource) -> None:
    """Makes `layer` (decoder layer `index`) run `source.layer(index)` when it is not None."""
    if hasattr(layer, "_mono_stock"):
        raise RuntimeError(f"decoder layer {index} already dispatches to mono")
    layer._mono_source = source
    layer._mono_index = index
    layer.__class__ = _dispatching(type(layer))


def uninstall(layer: torch.nn.Module) -> None:
    """Restores vLLM's class (used when the executor closes)."""
    stock = getattr(type(layer), "_mono_stock", None)
    if stock is None:
        return
    layer.__class__ = stock
    del layer._mono_source, layer._mono_index
