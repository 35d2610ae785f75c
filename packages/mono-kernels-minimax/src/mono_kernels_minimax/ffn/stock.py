"""vLLM 0.33's own MXFP4 expert path on Hopper, run beside the kernel as a baseline.

Why: `OpByOp` (bench.py) runs the routed experts as grouped GEMMs over bf16 copies of the
weights, reading four times the bytes of MXFP4, so it flatters the kernel. What vLLM 0.33
really runs for MiniMax-M3's MXFP4 experts on an H200 (SM90, bf16 activations, no expert
parallelism) is HUMMING (the ``humming-kernels`` package vLLM depends on): its
``HummingIndexedExperts`` (fused_moe/experts/fused_humming_moe.py), whose GEMMs read the
4-bit codes and e8m0 scales. `Stock` is `OpByOp` with its routed experts replaced by that
path, calling the ``humming`` package directly (no vLLM needed):

- weights, once: each checkpoint-layout (``mxfp4-k32``) stack goes through humming's own
  conversion the way vLLM's `convert_to_humming_moe_kernel_format` drives it for
  ``quant_method: mxfp4``: `Mxfp4WeightSchema.convert_humming` (w13 as two N stacks, gate
  and up), then `prepare_and_transform_humming_tensors` with N padded to a multiple of 256,
  K to 128, bf16 activations (`HummingInputSchema()`, what vLLM uses while
  VLLM_HUMMING_INPUT_QUANT_CONFIG is unset) and no bias. On a GPU the repacking is
  humming's CUDA kernel; tests/test_ffn_stock.py checks the result against vLLM's own
  conversion bit for bit.
- each step, as ``HummingIndexedExperts.apply``: the routed (token, k) pairs grouped by
  expert into blocks of the w13 GEMM's M tile (vLLM's ``moe_align_block_size``, a CUDA op
  of vLLM's; here `align`, one Triton launch, the same grouping); the indexed w13
  GEMM (top_k rows of each token); the activation, fused by humming into the processing of
  the w2 GEMM's input (MiniMax-M3's ``swigluoai_uninterleave``: humming's "binary_split"
  over the [gate | up] halves, with the model's clamp limit, alpha and beta); the indexed
  w2 GEMM over the S * top_k rows (aligned again where its M tile differs); the top-k
  weighted sum in fp32, rounded to bf16 (vLLM's ``moe_fused_mul_sum``, one Triton kernel;
  here a torch.compile'd function).

Flags as vLLM sets them by default: fp32 accumulation, no batch invariance, gemm type
"indexed", the heuristics' tuning table for SM90. vLLM hands humming the whole table and
humming's launcher takes the entry whose M interval holds the step's S * top_k rows; here
that entry is handed over alone (the same kernel, fewer run-time compiles). Buffers are
plain allocations (vLLM carves them from its workspace). The path is graph-capturable: the
kernels launch on torch's current stream and all host-side choices depend on shapes only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..config import MiniMaxM3Config
from ..formats import WeightFormat
from .bench import STOCK as STOCK_LABEL
from .bench import OpByOp
from .weights import FfnWeights

PAD_N, PAD_K = 256, 128  # vLLM pads each HUMMING MoE matrix's N and K to multiples of these


def humming_missing() -> str | None:
    """Why the stock baseline cannot run in this process (None: it can)."""
    try:
        import humming.forward  # noqa: F401
        import humming.schema  # noqa: F401
        import humming.transform  # noqa: F401
        import humming.tune  # noqa: F401
    except Exception as err:  # noqa: BLE001 (any failure to load is the reason)
        return f"humming not importable: {type(err).__name__}: {err}"[:300]
    return None


def humming_experts(codes: torch.Tensor, scales: torch.Tensor, n: int, k: int, gate_up: bool):
    """(humming LayerConfig, tensors) of one checkpoint ``mxfp4-k32`` expert stack (codes
    uint8 [E, n, k/2], scales uint8 [E, n, k/32]) in HUMMING's layout, converted by humming's
    own functions as vLLM converts them (module docstring). The inputs are left untouched;
    the outputs share no memory with them."""
    from humming.schema import HummingInputSchema, Mxfp4WeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    experts = codes.shape[0]
    stacks = [n // 2, n // 2] if gate_up else [n]
    schema, tensors = Mxfp4WeightSchema().convert_humming(
        tensors={"weight": codes.clone(), "weight_scale": scales.clone()},
        shape_n_stacks=stacks,
        shape_k_stacks=[k],
        param_dtype=torch.bfloat16,
        num_experts=experts,
    )
    return prepare_and_transform_humming_tensors(
        tensors=tensors,
        shape_n=n,
        shape_k=k,
        pad_n_to_multiple=PAD_N,
        pad_k_to_multiple=PAD_K,
        input_schema=HummingInputSchema().to_humming_schema(torch.bfloat16),
        weight_schema=schema,
        has_bias=False,
        num_experts=experts,
        torch_dtype=torch.bfloat16,
        device=codes.device,
    )


def activation_impl(cfg: MiniMaxM3Config) -> str:
    """MiniMax-M3's expert activation (reference.swiglu_oai) as the CUDA expression of `a`
    (gate) and `b` (up) that humming's input processing evaluates in fp32."""
    limit, alpha, beta = (f"{float(v)!r}f" for v in (cfg.swiglu_limit, cfg.swiglu_alpha,
                                                       cfg.swiglu_beta))  # fmt: skip
    gate = f"fminf(a, {limit})"
    up = f"fmaxf(fminf(b, {limit}), -{limit})"
    return f"{gate} / (1.f + expf(-{alpha} * {gate})) * ({up} + {beta})"


# -- routing, grouped by expert --------------------------------------------------------------
def align_slots(pairs: int, block: int, experts: int) -> tuple[int, int]:
    """(sorted-id slots, blocks) allocated for `pairs` routed (token, k) pairs: every expert
    padded to whole blocks, at most `pairs` non-empty experts."""
    slots = pairs + experts * (block - 1)
    if pairs < experts:
        slots = min(pairs * block, slots)
    return slots, -(-slots // block)


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, blocks_ptr, total_ptr, pairs, experts, slots, blocks,
    BLOCK_M: tl.constexpr, PAIRS: tl.constexpr, EXPERTS: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """One program: counts per expert, each padded to BLOCK_M; each pair's slot (its expert's
    start + the pairs before it of the same expert); every slot's pair (`pairs` where none),
    every block's expert (0 past the used blocks) and the used slots' total."""
    i = tl.arange(0, PAIRS)
    e = tl.arange(0, EXPERTS)
    ids = tl.load(ids_ptr + i, mask=i < pairs, other=-1).to(tl.int32)
    valid = (ids >= 0) & (ids < experts)
    hit = (ids[:, None] == e[None, :]) & valid[:, None]
    hits = hit.to(tl.int32)
    padded = (tl.sum(hits, axis=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    earlier = tl.cumsum(hits, axis=0) - hits
    slot = tl.sum(tl.where(hit, (ends - padded)[None, :] + earlier, 0), axis=1)
    slot = tl.where(valid, slot, -1)
    total = tl.sum(padded, axis=0)
    tl.store(total_ptr, total)
    for c in range(0, slots, CHUNK):
        p = c + tl.arange(0, CHUNK)
        owner = tl.sum(tl.where(slot[None, :] == p[:, None], i[None, :] + 1, 0), axis=1)
        tl.store(sorted_ptr + p, tl.where(owner > 0, owner - 1, pairs), mask=p < slots)
    for c in range(0, blocks, CHUNK):
        b = c + tl.arange(0, CHUNK)
        first = b * BLOCK_M
        before = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(blocks_ptr + b, tl.where(first < total, before, 0), mask=b < blocks)


def align(ids: torch.Tensor, block: int, experts: int):
    """(sorted_ids int32 [slots], expert_ids int32 [blocks], num_tokens_padded int32 [1]) of
    the routing `ids` [S, k], as vLLM's ``moe_align_block_size`` gives them to humming's
    indexed GEMMs: the flat (token * k + j) pair indices grouped by expert in expert order,
    each expert's group padded to a multiple of `block` with the index S * k, the expert of
    each block, the padded total. Negative or out-of-range ids are left out."""
    pairs = ids.numel()
    slots, blocks = align_slots(pairs, block, experts)
    sorted_ids = torch.empty(slots, dtype=torch.int32, device=ids.device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    total = torch.empty(1, dtype=torch.int32, device=ids.device)
    _align_kernel[(1,)](
        ids.reshape(-1), sorted_ids, expert_ids, total, pairs, experts, slots, blocks,
        BLOCK_M=block, PAIRS=triton.next_power_of_2(max(pairs, 16)),
        EXPERTS=triton.next_power_of_2(max(experts, 16)), CHUNK=128,
    )  # fmt: skip
    return sorted_ids, expert_ids, total


def _weighted_sum(down: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """bf16 [S, H]: each token's k expert outputs `down` [S, k, H] weighted in fp32."""
    return (down.float() * weights[..., None].float()).sum(1).to(torch.bfloat16)


# -- the path --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """What the experts of a step of `rows` routed pairs launch with (shapes only)."""

    tuning: dict[str, str]  # sublayer -> its tuning entry for these rows, as JSON
    block: dict[str, int]  # sublayer -> the M tile its rows are aligned to


def tuning_entry(table: list, rows: int) -> dict | None:
    """The entry of a humming tuning table ([(lower, upper, config), ...]) for `rows`."""
    for lower, upper, config in table:
        if lower < rows <= upper:
            return config
    return None


class Stock(OpByOp):
    """The FFN tail of each of `layers` with vLLM's HUMMING MXFP4 experts (module
    docstring); the rest (seam, router, top-k, shared expert) is `OpByOp`'s.
    `self(part, residual, layer)` runs one layer; graph-capturable. `layers` must hold
    MXFP4 experts in the checkpoint layout (build it before the runner packs them)."""

    label = STOCK_LABEL

    def __init__(self, cfg: MiniMaxM3Config, layers: list[FfnWeights]):
        why = humming_missing()
        if why is not None:
            raise RuntimeError(why)
        for n, w in enumerate(layers):
            if w.fmt is not WeightFormat.MXFP4 or w.rot:
                raise ValueError(
                    f"layers[{n}]: the stock path needs MXFP4 experts in the checkpoint "
                    f"layout (got {w.fmt.value}{', mxfp4-rot' if w.rot else ''})"
                )
        from humming.config import GemmType
        from humming.tune import get_heuristics_config

        self.configs: dict = {}  # sublayer -> humming LayerConfig (every layer's alike)
        super().__init__(cfg, layers)
        self.compute = json.dumps(
            {"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "indexed"}
        )
        self.tables = {
            name: get_heuristics_config(
                layer_config=config,
                use_f16_accum=False,
                use_batch_invariant=False,
                gemm_type=GemmType.INDEXED,
            )
            for name, config in self.configs.items()
        }
        device = layers[0].w13.device
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.locks = torch.zeros(sms * 8, dtype=torch.int32, device=device)
        self.activation = activation_impl(cfg)
        self.plans: dict[int, _Plan] = {}
        self.sum = torch.compile(_weighted_sum)

    def _experts(self, w: FfnWeights) -> dict:
        h, i = self.cfg.hidden_size, w.w2.shape[-1] * 2
        out = {}
        for name, n, k in (("w13", 2 * i, h), ("w2", h, i)):
            config, tensors = humming_experts(
                getattr(w, name), getattr(w, f"{name}_scale"), n, k, gate_up=name == "w13"
            )
            if self.configs.setdefault(name, config) != config:
                raise ValueError(f"{name}: the layers' HUMMING configs differ")
            out[name] = tensors
        return out

    def plan(self, rows: int) -> _Plan:
        """The tuning entries and M tiles for a step of `rows` = S * top_k routed pairs."""
        if rows not in self.plans:
            tuning, block = {}, {}
            for name, table in self.tables.items():
                entry = tuning_entry(table, rows)
                if entry is None:  # humming's launcher would find no kernel either
                    raise ValueError(f"{name}: no HUMMING tuning entry holds {rows} rows")
                tuning[name] = json.dumps(entry)
                block[name] = entry["block_shape"][0]
            self.plans[rows] = _Plan(tuning, block)
        return self.plans[rows]

    def routed(self, x, ids, wt, w) -> torch.Tensor:
        from humming.forward import humming_forward, may_process_input

        s, k = ids.shape
        rows, experts = s * k, self.cfg.num_experts
        plan = self.plan(rows)
        c13, c2 = self.configs["w13"], self.configs["w2"]
        index13 = align(ids, plan.block["w13"], experts)
        index2 = index13
        if plan.block["w2"] != plan.block["w13"]:
            index2 = align(ids, plan.block["w2"], experts)

        def gemm(config, name, inputs, index, top_k):
            t = w[name]
            out = torch.empty(
                inputs.shape[0] * top_k,
                config.shape_n - config.pad_shape_n,
                dtype=torch.bfloat16,
                device=inputs.device,
            )
            return humming_forward(
                config,
                inputs=inputs,
                weight=t["weight"],
                weight_scale=t["weight_scale"],
                zero_point=t.get("zero_point"),
                bias=t.get("bias"),
                weight_scale_2=t.get("weight_scale_2"),
                outputs=out,
                sorted_ids=index[0],
                expert_ids=index[1],
                num_tokens_padded=index[2],
                locks=self.locks,
                top_k=top_k,
                valid_shape_m=rows,
                compute_config=self.compute,
                tuning_config=plan.tuning[name],
            )

        gate_up = gemm(c13, "w13", x, index13, k)
        act = torch.empty(rows, gate_up.shape[1] // 2, dtype=torch.bfloat16, device=x.device)
        act, _, _ = may_process_input(
            c2,
            inputs=gate_up,
            outputs=act,
            activation_type="binary_split",
            activation_impl=self.activation,
        )
        down = gemm(c2, "w2", act, index2, 1)
        return self.sum(down.view(s, k, -1), wt)
