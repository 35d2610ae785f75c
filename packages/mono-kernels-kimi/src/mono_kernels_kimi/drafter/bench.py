"""Drafter benchmark on one GPU, under CUDA graph replay, reading from HBM.

Shapes: the Kimi-K3 DSpark drafter of `DrafterTriton.example()` (5 layers, hidden 7168,
the assumed 64 heads of 128 + 64, v 128, intermediate 18432, 7 speculative tokens, KV
blocks of 64, bf16 cache) at ONE TP8 rank's shapes (8 heads, 2304 intermediate columns),
launched at TP 1 on one GPU: the in-kernel all-reduces run over this rank alone (their
cross-GPU latency is the multi-GPU tier's); the replicated fused_qkv_a_proj is read whole,
as a TP8 rank reads it. Each row is R requests (one launch: the runner splits only past 8)
each with `context` cached tokens before its block.

One weight set, not a rotation over several: a launch already runs the 5 draft layers,
each on its own weights (~150 MB a layer at these shapes, ~0.75 GB a launch, over ten
times an H200's L2), so no layer finds its weights in the L2 left by the previous one or by
the previous replay. The KV caches are allocated once, for the largest row, because the
runner binds them at construction; a row's block table names a shuffled subset of blocks.
Cache values are random (timing does not depend on them). Figures, all from one run:

- kernel_us: per launch, a graph of step_begin and one launch of the R requests;
- bytes: what a launch must move: every weight of the 5 layers and the final norm, the KV
  entries each request's attention reads (context + block, every layer), the block's
  entries it writes, the embeddings in, the hidden states out, the step metadata and the
  RoPE rows it reads (scratch traffic between the kernel's stages is not counted);
- limit_pct: bytes / copy bandwidth (measured in the same run) over kernel_us;
- l2_x: bytes over the L2 size;
- opbyop_us, speedup: the op-by-op path of the same step: the drafter reference's math
  with `exact=False` (bf16 GEMMs and bmms), its attention batched over the requests (fp32
  logits and softmax, as the reference) on a fixed key-slot table so that it can be
  captured (the reference itself loops over requests with host syncs and clones every
  cache), in torch.compile'd pieces (projections, attention, add + norm, MLP) around an
  eager cache write. It fails without stopping the run: its row then has a note.

`bench(...)` returns one row dict per (requests, context) (`mono bench drafter` wraps it);
from a shell: `python3 -m mono_kernels_kimi.drafter.bench --requests 1,4 --context 1024`;
`--timeline DIR` instead prints each R's item timeline and draws it in DIR (rows beside it
as JSON); `--variants "|occ=2|gks=7"` instead times each MONO_DRAFTER_TILES variant
(all compiled side by side first), a table for tuning.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import torch
from mono_runtime.report import layer_table
from mono_runtime.timing import copy_bandwidth, graph_time

from ..k2.reference import linear, rms_norm
from .build import DrafterTriton
from .config import DrafterConfig
from .inputs import DraftStep
from .reference import (
    act_and_mul,
    add_rms_norm,
    bmm,
    cos_sin_cache,
    dequantize_fp8,
    from_cache,
    quantize_fp8,
    rms_norm_once,
    rope,
    to_cache,
)
from .runner import DrafterRunner
from .spec import MAX_REQUESTS, NARROW, TILES_ENV, timeline_deps
from .weights import DrafterWeights, random_weights

BF16, F32 = torch.bfloat16, torch.float32
MAX_CONTEXT = 131072  # 8 requests' caches at this length: 6 GB; the op-by-op path's keys more
REQUESTS = (1, 2, 4, 8)
CONTEXTS = (1024, 8192, 32768)


def rank_config(tp: int = 8) -> DrafterConfig:
    """The registered example drafter (a TP8 rank's config) with one TP `tp` rank's heads
    and intermediate columns, at TP 1."""
    cfg = DrafterTriton.example().key.cfg
    return replace(
        cfg,
        tp=1,
        num_attention_heads=cfg.num_attention_heads // tp,
        intermediate_size=cfg.intermediate_size // tp,
    )


def blocks_of(cfg: DrafterConfig, context: int) -> int:
    """KV blocks one request owns: its context and its block of query tokens."""
    return -(-(context + cfg.query_len) // cfg.block_size)


def step_on_device(
    cfg: DrafterConfig,
    requests: int,
    context: int,
    caches: list[torch.Tensor],
    seed: int,
    device,
) -> DraftStep:
    """One step of `requests` live requests with `context` cached tokens each, over
    `caches` (allocated for the largest row, values random): each request's blocks are a
    shuffled draw of the cache's blocks 1.. (0 is the null block), so that consecutive
    requests do not read consecutive memory. Built on `device` directly: a 32K context's
    entries through the stock context precompute (inputs.step_inputs) would take minutes
    on a CPU."""
    g = torch.Generator().manual_seed(seed)
    q, bs = cfg.query_len, cfg.block_size
    nb = blocks_of(cfg, context)
    have = caches[0].shape[0] - 1
    if requests * nb > have:
        raise ValueError(f"{requests} requests of {nb} blocks: the caches hold {have}")
    order = 1 + torch.randperm(have, generator=g)[: requests * nb]
    block_table = order.view(requests, nb).to(torch.int32)
    pos = torch.arange(context, context + q)
    positions = pos.repeat(requests)
    slots = block_table[:, pos // bs].long() * bs + pos % bs
    embeds = torch.randn(requests * q, cfg.hidden_size, generator=g).to(BF16)
    return DraftStep(
        embeds=embeds.to(device),
        positions=positions.to(device),
        slot_mapping=slots.flatten().to(device),
        block_table=block_table.to(device),
        seq_lens=torch.full((requests,), context + q, dtype=torch.int32, device=device),
        caches=caches,
        live=torch.ones(requests, dtype=torch.bool, device=device),
        context_entries=[],
    )


def random_caches(cfg: DrafterConfig, blocks: int, seed: int, device) -> list[torch.Tensor]:
    """One cache a layer of `blocks` blocks, random O(1) entries drawn on `device`."""
    g = torch.Generator(device=device).manual_seed(seed)
    scale = torch.tensor(1.0, device=device)
    return [
        to_cache(
            torch.randn(blocks, cfg.block_size, cfg.kv_entry, generator=g, device=device),
            cfg,
            scale,
        )
        for _ in range(cfg.num_hidden_layers)
    ]


def bytes_read(cfg: DrafterConfig, w: DrafterWeights, requests: int, context: int) -> int:
    """What one launch of `requests` requests with `context` cached tokens must move: see
    the module docstring."""
    weights = sum(t.numel() * t.element_size() for lw in w.layers for t in lw.tensors().values())
    weights += w.final_norm.numel() * w.final_norm.element_size()
    t, seq = requests * cfg.query_len, context + cfg.query_len
    layers, entry = cfg.num_hidden_layers, cfg.kv_entry_bytes
    kv = layers * entry * (requests * seq + t)  # every key of a request read, its block written
    activations = 2 * t * cfg.hidden_size * 2  # embeddings in, hidden states out (bf16)
    # positions, slots (int64), RoPE cos|sin rows (fp32), block table rows, seq_lens (int32)
    metadata = t * (8 + 8 + 4 * cfg.qk_rope_head_dim) + requests * (4 * blocks_of(cfg, context) + 4)
    return weights + kv + activations + metadata


class OpByOp:
    """The draft step from library ops (see the module docstring), capturable. Built once a
    run: torch.compile'd pieces take every weight as an argument, so one compiled graph
    serves all 5 layers and every row (no per-layer or per-row guard, which would run out
    of dynamo's recompile budget and fall back to eager unnoticed); the cache write
    (index_copy_) stays eager, so no compiled graph mutates, or copies back, a cache.
    `keys(step)` builds a step's fixed key-slot table [R, S] and mask on the device (no
    host sync in the step); `self(step, keys)` writes the block's cache entries and
    returns the hidden states [R x query_len, H]. Every token must own a slot (the bench
    has no padding requests)."""

    def __init__(self, cfg: DrafterConfig, w: DrafterWeights):
        self.cfg, self.w = cfg, w
        self.table = cos_sin_cache(cfg).to(w.final_norm.device)
        self.project = torch.compile(self._project)
        self.attend = torch.compile(self._attend)
        self.add_norm = torch.compile(self._add_norm)
        self.mlp = torch.compile(self._mlp)

    def keys(self, step: DraftStep) -> tuple[torch.Tensor, torch.Tensor]:
        """(key slots [R, S] int64, valid [R, S] bool) of `step`'s requests, S the longest
        seq_len; a request's positions past its own seq_len read slot 0, masked out."""
        if bool((step.slot_mapping < 0).any()):
            raise ValueError("OpByOp: every token must own a cache slot")
        cfg, device = self.cfg, step.embeds.device
        lens = step.seq_lens.cpu().long()
        pos = torch.arange(int(lens.max()))
        bt = step.block_table.cpu().long()
        page = bt[:, (pos // cfg.block_size).clamp(max=bt.shape[1] - 1)]
        valid = pos[None, :] < lens[:, None]
        slots = torch.where(valid, page * cfg.block_size + pos % cfg.block_size, 0)
        return slots.to(device), valid.to(device)

    def _project(self, x, positions, qkv_a, q_a_ln, kv_a_ln, q_b, w_uk, k_scale, q_scale):
        """Normed x -> (the block's cache entries as stored, the MQA query [T, n, L + R])."""
        cfg, acc, eps = self.cfg, F32, self.cfg.rms_norm_eps
        qkv = linear(x, qkv_a, acc, False)
        q_c, kv_c, k_pe = qkv.split([cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim], -1)
        q_c = rms_norm_once(q_c, q_a_ln, eps, acc)
        kv_c = rms_norm_once(kv_c, kv_a_ln, eps, acc)
        entry = torch.cat((kv_c, rope(k_pe, positions, self.table, acc)), dim=-1)
        q = linear(q_c, q_b, acc, False).view(-1, cfg.local_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        mqa_q = torch.cat(
            (bmm(q_nope, w_uk, acc, False), rope(q_pe, positions, self.table, acc)), -1
        )
        if cfg.fp8_cache:  # TRITON_MLA's bf16 query went through e4m3 (reference.py)
            mqa_q = dequantize_fp8(quantize_fp8(mqa_q, q_scale), q_scale)
        return to_cache(entry, cfg, k_scale), mqa_q

    def _attend(self, mqa_q, flat, key_slots, valid, k_scale, w_uv, o_proj):
        """Every request's queries over its keys (non-causal, fp32 logits and softmax, as
        the reference), then W_UV and this rank's o_proj partial."""
        cfg, acc = self.cfg, F32
        n, lat = cfg.local_heads, cfg.kv_lora_rank
        keys = from_cache(flat[key_slots], cfg, k_scale).to(acc)  # [R, S, L + R]
        mq = mqa_q.view(key_slots.shape[0], -1, n, cfg.kv_entry).to(acc)
        logits = torch.einsum("rqhe,rse->rqhs", mq, keys) * cfg.softmax_scale
        logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
        p = torch.softmax(logits, dim=-1)
        latent = torch.einsum("rqhs,rsl->rqhl", p, keys[..., :lat]).to(BF16).view(-1, n, lat)
        v = bmm(latent, w_uv, acc, False).flatten(1)
        return linear(v, o_proj, acc, False)

    def _add_norm(self, part, residual, w):
        return add_rms_norm([part], residual, w, self.cfg.rms_norm_eps, F32)

    def _mlp(self, x, gate_up_proj, down_proj):
        gate_up = linear(x, gate_up_proj, F32, False)
        return linear(act_and_mul(self.cfg, gate_up, F32), down_proj, F32, False)

    def __call__(self, step: DraftStep, keys: tuple[torch.Tensor, torch.Tensor]):
        cfg, w = self.cfg, self.w
        key_slots, valid = keys
        residual = step.embeds
        x = rms_norm(residual, w.layers[0].input_layernorm, cfg.rms_norm_eps, F32)
        mlp = None
        for i, lw in enumerate(w.layers):
            if i > 0:
                x, residual = self.add_norm(mlp, residual, lw.input_layernorm)
            stored, mqa_q = self.project(
                x, step.positions, lw.fused_qkv_a_proj, lw.q_a_layernorm, lw.kv_a_layernorm,
                lw.q_b_proj, lw.w_uk(cfg), lw.k_scale, lw.q_scale,
            )  # fmt: skip
            flat = step.caches[i].view(-1, cfg.kv_entry)
            flat.index_copy_(0, step.slot_mapping, stored)
            o = self.attend(mqa_q, flat, key_slots, valid, lw.k_scale, lw.w_uv(cfg), lw.o_proj)
            x, residual = self.add_norm(o, residual, lw.post_attention_layernorm)
            mlp = self.mlp(x, lw.gate_up_proj, lw.down_proj)
        return self.add_norm(mlp, residual, w.final_norm)[0]


def _row(cfg, runner, base, w, caches, r, ctx, copy, l2, seed) -> dict:
    device = runner.device
    step = step_on_device(cfg, r, ctx, caches, seed, device)
    out = torch.empty_like(step.embeds)

    def launch():
        runner.step_begin()
        runner(step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens, out)

    launch()  # eager first: a fault shows here, outside the graph
    runner.after_step()
    t_kernel = graph_time(launch)
    runner.after_step()  # raises MonoFault if any wait of the replays gave up
    nbytes = bytes_read(cfg, w, r, ctx)
    t_base, note = None, None
    if base is not None:
        try:
            keys = base.keys(step)
            t_base = graph_time(lambda: base(step, keys))
        except Exception as err:  # noqa: BLE001 (reported in the row, not fatal)
            note = f"op-by-op path failed: {type(err).__name__}: {err}"[:300]
        finally:
            torch.cuda.empty_cache()  # the graph's pool: GBs of gathered keys at long contexts
    return dict(
        rows=r,
        requests=r,
        context=ctx,
        layers=cfg.num_hidden_layers,
        kernel_us=t_kernel * 1e6,
        bytes=nbytes,
        copy_tbps=copy / 1e12,
        limit_pct=100.0 * nbytes / copy / t_kernel,
        l2_x=nbytes / l2 if l2 else None,
        opbyop_us=None if t_base is None else t_base * 1e6,
        speedup=None if t_base is None else t_base / t_kernel,
        note=note,
    )


def _ints(name: str, values, most: int) -> tuple[int, ...]:
    values = tuple(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ValueError(f"{name} {values}: expected integers 1..{most}")
    if any(not 1 <= v <= most for v in values):
        raise ValueError(f"{name} {values}: each must be 1..{most}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} {values}: a value appears twice")
    return values


def check(requests, contexts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Bad arguments fail here, before anything is allocated or compiled: requests 1..8
    (one launch of the wide build), context lengths 1..MAX_CONTEXT tokens."""
    return _ints("requests", requests, MAX_REQUESTS), _ints("context", contexts, MAX_CONTEXT)


def bench(
    requests=REQUESTS, contexts=CONTEXTS, device: str = "cuda", seed: int = 0, baseline=True
) -> list[dict]:
    """One row per (requests, context): rows (= requests, the x axis of `mono bench`),
    requests, context, layers, kernel_us, bytes, copy_tbps, limit_pct, l2_x, opbyop_us,
    speedup, note (why the op-by-op path has no figure)."""
    requests, contexts = check(requests, contexts)
    device = torch.device(device)
    copy = copy_bandwidth(device)  # first: without a GPU, its error says so
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cfg = rank_config()
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    w = random_weights(cfg, seed, 0, device)
    caches = random_caches(cfg, 1 + max(requests) * blocks_of(cfg, max(contexts)), seed, device)
    rope_table = cos_sin_cache(cfg).to(device)
    runner = DrafterRunner(cfg, None, 0, device, w, caches, rope_table)
    base = OpByOp(cfg, w) if baseline else None
    try:
        runner.warm()
        return [
            _row(cfg, runner, base, w, caches, r, ctx, copy, l2, seed + r + ctx)
            for ctx in contexts
            for r in requests
        ]
    finally:
        runner.close()


def timelines(requests=(1, 8), context=8192, device: str = "cuda", seed: int = 0, out=None):
    """Per request count, the item timeline of an eager launch (timeline builds: the same
    plan, every ticket stamped), at `context` cached tokens a request: printed per stage,
    and a picture in `out` (a folder) when given."""
    from mono_runtime.timeline import show

    requests, (context,) = check(requests, (context,))
    device = torch.device(device)
    cfg = rank_config()
    w = random_weights(cfg, seed, 0, device)
    caches = random_caches(cfg, 1 + max(requests) * blocks_of(cfg, context), seed, device)
    runner = DrafterRunner(cfg, None, 0, device, w, caches, cos_sin_cache(cfg).to(device),
                           timeline=True)  # fmt: skip
    try:
        runner.warm()
        for r in requests:
            step = step_on_device(cfg, r, context, caches, seed + r, runner.device)
            for _ in range(2):  # the second launch runs on a warm clock and caches
                runner.step_begin()
                runner(
                    step.embeds, step.positions, step.slot_mapping, step.block_table,
                    step.seq_lens,
                )  # fmt: skip
                runner.after_step()
            show(
                runner.timeline(r > NARROW),
                f"drafter timeline R={r} context={context} (us from the launch's first item)",
                None if out is None else f"{out}/timeline-drafter-r{r}.png",
                f"drafter, R = {r}, {context} cached",
                timeline_deps(runner.builds[r > NARROW]),
            )
    finally:
        runner.close()


def _warm_variant(tiles: str) -> str:
    """Compile one variant's builds into Triton's cache (a child process; its error text,
    empty when it compiled)."""
    os.environ[TILES_ENV] = tiles
    try:
        cfg = rank_config()
        device = torch.device("cuda", torch.cuda.current_device())
        w = random_weights(cfg, 0, 0, device)
        caches = random_caches(cfg, 2, 0, device)
        runner = DrafterRunner(cfg, None, 0, device, w, caches, cos_sin_cache(cfg).to(device))
        try:
            runner.warm()
        finally:
            runner.close()
        return ""
    except Exception as err:  # noqa: BLE001 (a variant that fails is a row)
        return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"


def tune(variants, requests=(1, 8), contexts=(8192,), jobs: int = 8) -> Iterator[dict]:
    """us per launch of each MONO_DRAFTER_TILES variant ("" the default) at each
    (requests, context), no op-by-op path: every variant compiled side by side in child
    processes first, then timed one after another here. One row a variant and case, each
    yielded as it is timed (a call that runs out of time keeps what it timed)."""
    requests, contexts = check(requests, contexts)
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(variants)), mp_context=ctx) as pool:
        errors = dict(zip(variants, pool.map(_warm_variant, variants), strict=True))
    for tiles in variants:
        if errors[tiles]:
            yield dict(tiles=tiles, error=errors[tiles])
            continue
        os.environ[TILES_ENV] = tiles
        try:
            rows = bench(requests, contexts, baseline=False)
        except Exception as err:  # noqa: BLE001 (a variant that fails is a row)
            yield dict(tiles=tiles, error=f"{type(err).__name__}: {err}"[:200])
            continue
        finally:
            os.environ.pop(TILES_ENV, None)
        yield from (dict(r, tiles=tiles) for r in rows)


COLUMNS = (
    ("requests", "{}"),
    ("context", "{}"),
    ("kernel_us", "{:.1f}"),
    ("bytes", "{:.3g}"),
    ("limit_pct", "{:.1f}"),
    ("l2_x", "{:.1f}"),
    ("opbyop_us", "{:.1f}"),
    ("speedup", "{:.2f}"),
)


def table(rows: list[dict]) -> str:
    """The rows as fixed-width text, one line each; notes after the table."""
    return layer_table(rows, COLUMNS, lambda r: f"R={r['requests']} context={r['context']}")


def _int_list(parser, flag: str, text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        parser.error(f"{flag} {text!r}: not a comma-separated list of integers")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="1,2,4,8", help="comma-separated R (1..8)")
    parser.add_argument(
        "--context", default="1024,8192,32768", help="comma-separated cached tokens a request"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the op-by-op path")
    parser.add_argument("--json", action="store_true", help="one JSON row a line")
    parser.add_argument(
        "--timeline",
        metavar="DIR",
        help="instead: each R's item timeline at the first --context, pictures in DIR",
    )
    parser.add_argument(
        "--variants",
        help="instead: time each '|'-separated MONO_DRAFTER_TILES variant ('' the default)",
    )
    args = parser.parse_args(argv)
    requests = _int_list(parser, "--requests", args.requests)
    contexts = _int_list(parser, "--context", args.context)
    try:
        check(requests, contexts)
    except ValueError as err:
        parser.error(str(err))
    if args.timeline:
        timelines(requests, contexts[0], out=args.timeline)
        return 0
    if args.variants is not None:
        for r in tune(args.variants.split("|"), requests, contexts):
            cell = r.get("error") or f"R={r['requests']} context={r['context']}: " + (
                f"{r['kernel_us']:9.1f} us {r['limit_pct']:5.1f}% of the limit"
            )
            print(f"[{r['tiles'] or 'default'}] {cell}", flush=True)
        return 0
    got = bench(requests, contexts, baseline=not args.no_baseline)
    print("\n".join(json.dumps(r) for r in got) if args.json else table(got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
