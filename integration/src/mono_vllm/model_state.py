"""mono's hooks in Model Runner V2's per-model state (`vllm.v1.worker.gpu.model_states`).

vLLM asks the model for its state class (``get_model_state_cls``) right after the weights
are loaded and before memory profiling, and calls the state's ``initialize_kv_cache``
after binding every KV cache it allocates (the small one for CUDA-graph memory
profiling, then the real one) and its ``prepare_attn`` to build each step's attention
metadata. Those are exactly the moments mono needs: build and warm the executor, bind
it to each KV cache, and record the step's per-request query starts for the planner.
The state vLLM would have used stays the base class, so everything else is unchanged.
"""

from __future__ import annotations

import weakref
from functools import cache
from typing import Any

from . import drafter


def text_model(model: Any) -> Any:
    """The text model (the one with ``mono``) of a multimodal wrapper, or `model` itself."""
    return model.get_language_model() if hasattr(model, "get_language_model") else model


@cache
def with_mono(base: type) -> type:
    """`base` (the model state vLLM picks for the model) plus mono's lifecycle."""

    class MonoModelState(base):
        def __init__(self, vllm_config, model, encoder_cache, device):
            super().__init__(vllm_config, model, encoder_cache, device)
            self.mono = getattr(text_model(model), "mono", None)
            if self.mono is not None:
                self.mono.build()
                weakref.finalize(self, self.mono.close).atexit = False

        def initialize_kv_cache(self, kv_cache_config, block_tables):
            super().initialize_kv_cache(kv_cache_config, block_tables)
            if self.mono is not None:
                self.mono.prepare_kv()
            # the draft model's caches are bound by now too, and vLLM hands it no state
            drafter.prepare_all()

        def prepare_attn(self, input_batch, cudagraph_mode, *args, **kwargs):
            metadata = super().prepare_attn(input_batch, cudagraph_mode, *args, **kwargs)
            if self.mono is not None:
                # the same request count vLLM's states build the metadata for
                full = cudagraph_mode.name == "FULL"
                reqs = input_batch.num_reqs_after_padding if full else input_batch.num_reqs
                self.mono.record_batch(metadata, input_batch.query_start_loc_np[: reqs + 1])
            return metadata

    MonoModelState.__name__ = MonoModelState.__qualname__ = f"Mono{base.__name__}"
    return MonoModelState
