"""mono's DSpark drafter inside vLLM: Kimi-K3's draft model on the drafter kernels.

vLLM builds the draft model through its registry (``K3DSparkModel``), so mono's subclass
(`mono_vllm.models.dspark`) takes its place when ``mono_decode`` is set and holds a
`MonoDrafter`. Its `DrafterRunner` is collective and reads the bound draft KV caches, so it
is built where the target's model state learns that every cache is bound (`prepare_all`:
eager, on every rank alike, before graph capture) and built again when the caches are
re-bound. A draft forward whose batch the kernels serve (``query_len`` rows a request, one
block table and slot mapping for every draft layer, no prefill) runs on them; any other
runs vLLM's layers. The draft step runs inside vLLM's graph with no eager point after it,
so a give-up raises MonoFault on every rank at the target's next logits (`after_step_all`),
before any logits of that step; the drafts of the failed step are only proposals, which
the target's verification rejects where it disagrees.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from mono_runtime.errors import MonoUnsupported

from .host import vllm_logger
from .switch import SWITCH, requested

# Every live drafter of this process (a worker holds one draft model): the target's model
# state and logits reach them here, since vLLM hands neither the draft model.
LIVE: weakref.WeakSet[MonoDrafter] = weakref.WeakSet()


def draft_config(vllm_config: Any, backbone: Any, tp: int) -> Any:
    """The `DrafterConfig` of vLLM's loaded draft model (`backbone`: its ``K3DSparkModel``)
    at TP `tp`, field by field from the draft's hf_config, the speculative config and the
    layers' own cache (dtype, block); ValueError names what the kernels do not take."""
    from mono_kernels_kimi.drafter.config import DrafterConfig

    spec = vllm_config.speculative_config
    hf = spec.draft_model_config.hf_config
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    attn = backbone.layers[0].self_attn
    if getattr(attn, "use_output_gate", False):
        raise ValueError("an MLA output gate (the drafter kernels have none)")
    return DrafterConfig(
        num_hidden_layers=len(backbone.layers),
        hidden_size=hf.hidden_size,
        num_attention_heads=hf.num_attention_heads,
        q_lora_rank=hf.q_lora_rank,
        kv_lora_rank=hf.kv_lora_rank,
        qk_nope_head_dim=hf.qk_nope_head_dim,
        qk_rope_head_dim=hf.qk_rope_head_dim,
        v_head_dim=hf.v_head_dim,
        intermediate_size=hf.intermediate_size,
        hidden_act=hf.hidden_act,
        rms_norm_eps=hf.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(hf, "rope_theta", 0.0))),
        rope_type=rope.get("rope_type", "default"),
        max_position_embeddings=hf.max_position_embeddings,
        num_speculative_tokens=spec.num_speculative_tokens,
        block_size=_block_size(attn.kv_cache, vllm_config.cache_config.block_size),
        tp=tp,
        cache_dtype=attn.kv_cache_dtype,
        sample_from_anchor=bool(getattr(hf, "sample_from_anchor", True)),
    )


def _block_size(cache: Any, configured: int) -> int:
    """Tokens a block of the bound draft cache (as the kernel reads it: `cache_view`): the
    attention backend may split the configured block into kernel blocks, and the block
    table it builds counts those; `configured` until a cache is bound."""
    from mono_kernels_kimi.drafter.runner import cache_view

    view = cache_view(cache)
    return view.shape[1] if isinstance(view, torch.Tensor) and view.dim() == 3 else configured


def _scale(attn: Any, name: str, device: torch.device) -> torch.Tensor:
    """The layer's fp32 cache scale as a 0-d view (vLLM keeps a 1-element tensor; 1.0
    where the checkpoint has none, as vLLM's default scales)."""
    t = getattr(attn, name, None)
    if t is None:
        return torch.ones((), dtype=torch.float32, device=device)
    if not isinstance(t, torch.Tensor) or t.numel() != 1:
        raise ValueError(f"{name}: expected one fp32 scale, got {t!r}")
    return t.reshape(())


def draft_weights(backbone: Any) -> Any:
    """This rank's draft weights as vLLM loaded them (`DrafterWeights`, read in place)."""
    from mono_kernels_kimi.drafter.weights import DrafterLayerWeights, DrafterWeights

    layers = []
    for layer in backbone.layers:
        a, mlp = layer.self_attn, layer.mlp
        device = a.kv_b_proj.weight.device
        layers.append(
            DrafterLayerWeights(
                input_layernorm=layer.input_layernorm.weight,
                fused_qkv_a_proj=a.fused_qkv_a_proj.weight,
                q_a_layernorm=a.q_a_layernorm.weight,
                kv_a_layernorm=a.kv_a_layernorm.weight,
                q_b_proj=a.q_b_proj.weight,
                kv_b_proj=a.kv_b_proj.weight,
                o_proj=a.o_proj.weight,
                post_attention_layernorm=layer.post_attention_layernorm.weight,
                gate_up_proj=mlp.gate_up_proj.weight,
                down_proj=mlp.down_proj.weight,
                k_scale=_scale(a, "_k_scale", device),
                q_scale=_scale(a, "_q_scale", device),
            )
        )
    return DrafterWeights(layers=tuple(layers), final_norm=backbone.final_norm.weight)


def draft_batch(context: Any, names: list[str], rows: int, query_len: int) -> tuple | str:
    """(block_table, seq_lens, slot_mapping) of a draft forward of `rows` rows from vLLM's
    forward context, or why the kernels do not take it (vLLM's layers run it)."""
    metadata, slots_by_layer = context.attn_metadata, context.slot_mapping
    if not isinstance(metadata, dict) or not isinstance(slots_by_layer, dict):
        return "no attention metadata (a profiling or dummy forward)"
    missing = [n for n in names if metadata.get(n) is None or slots_by_layer.get(n) is None]
    if missing:
        return f"no metadata for {', '.join(missing)}"
    first, slots = metadata[names[0]], slots_by_layer[names[0]]
    if any(metadata.get(n) is not first for n in names) or any(
        not isinstance(slots_by_layer.get(n), torch.Tensor)
        or slots_by_layer[n].data_ptr() != slots.data_ptr()
        for n in names
    ):
        return "draft layers in several KV cache groups (one block table each)"
    decode = getattr(first, "decode", None)
    if decode is None or getattr(first, "num_prefills", 0) or rows % query_len:
        return "not a uniform decode batch"
    if getattr(first, "num_decode_tokens", None) != rows:
        return f"{getattr(first, 'num_decode_tokens', None)} decode tokens of {rows} rows"
    reqs = rows // query_len
    table, seq_lens = decode.block_table, decode.seq_lens
    if table.shape[0] < reqs or seq_lens.shape[0] < reqs or slots.shape[0] < rows:
        return f"metadata for fewer than {reqs} requests"
    if (table.dtype, seq_lens.dtype, slots.dtype) != (torch.int32, torch.int32, torch.int64):
        return f"metadata dtypes {table.dtype}, {seq_lens.dtype}, {slots.dtype}"
    return table[:reqs], seq_lens[:reqs].contiguous(), slots[:rows].contiguous()


class MonoDrafter:
    """mono's drafter over one loaded draft model (``model.model`` is its K3DSparkModel)."""

    @classmethod
    def requested(cls, vllm_config: Any, model: Any) -> MonoDrafter | None:
        if not requested(vllm_config.additional_config):
            return None
        return cls(vllm_config, model)

    def __init__(self, vllm_config: Any, model: Any, make_runner: Any = None) -> None:
        """`make_runner(cfg, group, rank, device, weights, caches, rope)`: the rank's
        runner (`DrafterRunner` unless given)."""
        self.vllm_config, self.model, self.make_runner = vllm_config, model, make_runner
        self.runner: Any = None
        self.off = False  # refused for good: vLLM's layers run every draft step
        self.rank = 0
        self._fell_back: set[str] = set()
        # the draft layers' keys in vLLM's forward context (fixed once the model is built)
        self.layer_names = [layer.self_attn.layer_name for layer in model.model.layers]
        LIVE.add(self)

    def prepare_kv(self) -> None:
        """Builds (or, after a re-bind, rebuilds) the runner on the bound draft caches:
        collective, so every rank calls it at the same point; a refusal is agreed."""
        if self.off:
            return
        from mono_runtime.planner import agree
        from vllm.distributed import get_tp_group

        backbone = self.model.model
        caches = [layer.self_attn.kv_cache for layer in backbone.layers]
        if self.runner is not None and not self.runner.stale(caches):
            return
        self.close()
        tp = get_tp_group()
        self.rank = tp.rank_in_group
        reasons = []
        # the draft's own TP (vLLM's draft_parallel_config); the runner refuses a group of
        # another size
        spec = self.vllm_config.speculative_config
        draft_tp = getattr(getattr(spec, "draft_parallel_config", None), "tensor_parallel_size", 0)
        try:
            cfg = draft_config(self.vllm_config, backbone, draft_tp or tp.world_size)
            weights = draft_weights(backbone)
        except ValueError as err:
            reasons.append(str(err))
        try:
            agree(reasons, tp.cpu_group, "the DSpark drafter")
            make_runner = self.make_runner
            if make_runner is None:
                from mono_kernels_kimi.drafter.runner import DrafterRunner as make_runner
            device = backbone.final_norm.weight.device
            rope = backbone.layers[0].self_attn.rotary_emb.cos_sin_cache
            runner = make_runner(cfg, tp.cpu_group, self.rank, device, weights, caches, rope)
            try:
                runner.warm()
            except MonoUnsupported:
                runner.close()  # its peer buffer and scratch, before vLLM's layers take over
                raise
        except MonoUnsupported as err:
            self.off = True
            if self.rank == 0 or "another rank refused" not in str(err):
                vllm_logger().warning("mono drafter off, vLLM's draft layers run: %s", err)
            return
        self.runner = runner
        if self.rank == 0:
            vllm_logger().info(
                "mono drafter on (%s=true): %d DSpark draft layers and the final norm run "
                "as persistent kernels at TP %d, %d rows a request",
                SWITCH,
                cfg.num_hidden_layers,
                cfg.tp,
                cfg.query_len,
            )

    def forward(self, input_ids: Any, positions: Any, inputs_embeds: Any) -> Any:
        """The draft layers' and final norm's output on the kernels, or None when this
        forward is not one they serve (the caller runs vLLM's layers)."""
        runner = self.runner
        if runner is None:
            return None
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return None
        rows = positions.shape[0]
        batch = draft_batch(get_forward_context(), self.layer_names, rows, runner.cfg.query_len)
        if not isinstance(batch, str) and positions.dtype != torch.int64:
            batch = f"positions of dtype {positions.dtype}"
        if isinstance(batch, str):
            if batch not in self._fell_back and self.rank == 0:
                vllm_logger().info("mono drafter: a draft forward runs vLLM's layers: %s", batch)
            self._fell_back.add(batch)
            return None
        table, seq_lens, slots = batch
        embeds = inputs_embeds
        if embeds is None:
            embeds = self.model.model.embed_input_ids(input_ids)
        runner.step_begin()
        return runner(embeds.contiguous(), positions, slots, table, seq_lens)

    def after_step(self) -> None:
        if self.runner is not None:
            self.runner.after_step()

    def refuse_reload(self) -> None:
        if self.runner is not None:
            raise RuntimeError(
                f"{SWITCH}: draft weight reloads are not supported (the drafter kernels read "
                "the loaded weights in place); restart the server to serve new weights"
            )

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None


def prepare_all() -> None:
    """Every live drafter, after vLLM bound the KV caches (the target's model state)."""
    for drafter in list(LIVE):
        drafter.prepare_kv()


def after_step_all() -> None:
    """Every live drafter's fault check (the target's logits, eager on every rank)."""
    for drafter in list(LIVE):
        drafter.after_step()
