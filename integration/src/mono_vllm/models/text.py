"""What every mono text model adds to vLLM's: the per-step plan around the stock forward,
the fault check before logits, the model-state hook, and the refusal of weight reloads.

`mono_class(base, family)` builds mono's subclass of one of vLLM's text model classes (the
NVIDIA or the AMD one, whichever vLLM exports on the platform). With ``mono_decode`` off
(``self.mono is None``) each method is vLLM's own.
"""

from __future__ import annotations

from typing import Any

from .. import drafter
from ..host import MonoDecode


class MonoTextModel:
    """Mixin placed before vLLM's text model class (``...ForCausalLM``); `family` names the
    layer kernels of the model (a `mono_vllm.families` class)."""

    family: type
    mono: MonoDecode | None = None

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.mono = MonoDecode.requested(vllm_config, self.family, self)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kw):
        if self.mono is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)
        self.mono.begin(positions, intermediate_tensors)
        try:
            out = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)
        except BaseException:
            self.mono.abandon()
            raise
        return self.mono.end(out)

    def compute_logits(self, hidden_states, *args, **kwargs):
        # eager on every rank, also when the forward was a graph replay: a rank's give-up
        # raises here on every rank, before any logits of that step exist
        if self.mono is not None:
            self.mono.after_step()
        drafter.after_step_all()  # the previous step's draft, which has no eager point
        return super().compute_logits(hidden_states, *args, **kwargs)

    def load_weights(self, weights):
        if self.mono is not None:
            self.mono.refuse_reload()
        return super().load_weights(weights)

    def get_model_state_cls(self):
        from ..model_state import with_mono

        parent = getattr(super(), "get_model_state_cls", None)
        if parent is not None:
            return with_mono(parent())
        # what vLLM resolves for a model that is neither hybrid, encoder-decoder nor
        # encoder-only (MiniMax-M3 on NVIDIA)
        from vllm.v1.worker.gpu.model_states.default import DefaultModelState

        return with_mono(DefaultModelState)


class LocalLogits:
    """The batch-sharded sampler's logits (``compute_logits_local``, which vLLM calls only
    on a model that has it): the same fault check as ``compute_logits``."""

    def compute_logits_local(self, hidden_states):
        if self.mono is not None:
            self.mono.after_step()
        drafter.after_step_all()
        return super().compute_logits_local(hidden_states)


def mono_class(base: type, family: type, module: str) -> type:
    """mono's subclass of vLLM's text model class `base`, named ``Mono<base>`` in `module`."""
    mixins = (LocalLogits,) if hasattr(base, "compute_logits_local") else ()
    name = f"Mono{base.__name__}"
    body = {"family": family, "__module__": module, "__qualname__": name}
    return type(name, (MonoTextModel, *mixins, base), body)
