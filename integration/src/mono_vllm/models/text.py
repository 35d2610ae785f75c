"""What every mono text model adds to vLLM's: the per-step plan around the stock forward,
the fault check before logits, the model-state hook, and the refusal of weight reloads.

With ``mono_decode`` off (``self.mono is None``) each method is vLLM's own.
"""

from __future__ import annotations

from typing import Any

from ..host import MonoDecode


class MonoTextModel:
    """Mixin placed before vLLM's text model class (``...ForCausalLM``); `family` names the
    layer kernels of the model (a `mono_vllm.families` class)."""

    mono: MonoDecode | None = None

    def _init_mono(self, vllm_config: Any, family: type) -> None:
        self.mono = MonoDecode.requested(vllm_config, family, self)

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
