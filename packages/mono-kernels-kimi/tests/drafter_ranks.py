"""Rank bodies of the drafter kernel tests: each runs in a child process
(mono_peer.testing.spawn) whose environment sets TRITON_INTERPRET=1 on a CPU.

Every rank builds every rank's weights and the step's inputs from the same seeds (cheap at
tiny shapes), runs the kernel on its own shard and returns what the parent compares: its
outputs, its caches and their distances to drafter_reference.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from mono_kernels_kimi.drafter.config import DrafterConfig
from mono_kernels_kimi.drafter.inputs import step_inputs
from mono_kernels_kimi.drafter.reference import cos_sin_cache, drafter_reference
from mono_kernels_kimi.drafter.runner import DrafterRunner
from mono_kernels_kimi.drafter.weights import random_weights


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-20))


def _runner(cfg, group, rank, caches, seed, device="cpu", **kw):
    weights = random_weights(cfg, seed=seed, rank=rank, device=device)
    rope = cos_sin_cache(cfg).to(device)
    return DrafterRunner(cfg, group, rank, device, weights, caches, rope, **kw)


def check_steps(
    rank,
    world,
    group,
    cases,
    seed=0,
    cache_dtype="auto",
    device="cpu",
    hidden_size=None,
    speculative=None,
):
    """One step per case (requests, padding, context lengths or None) on one runner, whose
    caches hold every step's blocks; per step the distances to the reference, whether the
    caches match it and what the launch left alone (the padding requests' rows 0, every
    slot but the block's untouched). `device`: "cuda" on a GPU (test_drafter_gpu.py);
    `hidden_size` (q_lora_rank and intermediate_size too), `speculative`
    (num_speculative_tokens): the tiny model's, changed."""
    cfg = DrafterConfig.tiny(world, cache_dtype)
    if hidden_size is not None:
        cfg = replace(
            cfg, hidden_size=hidden_size, q_lora_rank=hidden_size, intermediate_size=hidden_size
        )
    if speculative is not None:
        cfg = replace(cfg, num_speculative_tokens=speculative)
    weights = [random_weights(cfg, seed=seed, rank=r, device=device) for r in range(world)]
    on_cpu = random_weights(cfg, seed=seed)  # the inputs' context precompute runs on a CPU
    steps = [
        step_inputs(
            cfg, on_cpu, reqs, seed=seed * 100 + i, padding=pad, context_lens=ctx, device=device
        )
        for i, (reqs, pad, ctx) in enumerate(cases)
    ]
    blocks = max(s.caches[0].shape[0] for s in steps)
    caches = [
        torch.zeros((blocks,) + c.shape[1:], dtype=c.dtype, device=device) for c in steps[0].caches
    ]
    runner = _runner(cfg, group, rank, caches, seed, device)
    records = []
    try:
        for step in steps:
            nb = step.caches[0].shape[0]
            for mine, theirs in zip(caches, step.caches, strict=True):
                mine[:nb].copy_(theirs)
            t0 = time.perf_counter()
            runner.step_begin()
            out = runner(
                step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens
            )
            runner.after_step()
            elapsed = time.perf_counter() - t0
            ref = drafter_reference(
                cfg, step.embeds, step.positions, step.caches, step.block_table, step.seq_lens,
                step.slot_mapping, weights, step.live,
            )  # fmt: skip
            rows = step.live.repeat_interleave(cfg.query_len)
            mine = [c[:nb] for c in caches]
            records.append(
                dict(
                    reqs=step.block_table.shape[0],
                    out=out.clone(),
                    err=rel_l2(out[rows], ref.hidden[rows]),
                    pad_zero=bool((out[~rows] == 0).all()),
                    cache_err=max(
                        rel_l2(_values(cfg, m, w), _values(cfg, r, w))
                        for m, r, w in zip(mine, ref.caches, weights[0].layers, strict=True)
                    ),
                    caches_same=all(
                        _same_except_block(cfg, m.cpu(), r.cpu(), step)
                        for m, r in zip(mine, ref.caches, strict=True)
                    ),
                    seconds=elapsed,
                )
            )
    finally:
        runner.close()
    return records


def kernel_waits(rank, world, group, cases, seed=0):
    """One launch per case (requests, padding, context lengths or None) with every item's
    waits recorded (mono_runtime.interp_waits; the kernel waits through the runtime's
    `wait_items`): per launch (requests, ticket -> the done pairs it waited
    for). The interpreter runs the tickets in order, so a missed wait shows only here."""
    from mono_runtime.interp_waits import recording

    cfg = DrafterConfig.tiny(world)
    on_cpu = random_weights(cfg, seed=seed)
    steps = [
        step_inputs(cfg, on_cpu, reqs, seed=seed * 100 + i, padding=pad, context_lens=ctx)
        for i, (reqs, pad, ctx) in enumerate(cases)
    ]
    blocks = max(s.caches[0].shape[0] for s in steps)
    caches = [torch.zeros((blocks,) + c.shape[1:], dtype=c.dtype) for c in steps[0].caches]
    runner = _runner(cfg, group, rank, caches, seed)
    out = []
    try:
        for step in steps:
            for mine, theirs in zip(caches, step.caches, strict=True):
                mine[: theirs.shape[0]].copy_(theirs)
            with recording() as seen:
                runner.step_begin()
                runner(
                    step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens
                )
                runner.after_step()
            out.append((step.block_table.shape[0], {t: sorted(v) for t, v in seen.items()}))
    finally:
        runner.close()
    return out


def _values(cfg, cache, layer):
    """The cache's entries as values (fp8 bytes decoded)."""
    from mono_kernels_kimi.drafter.reference import from_cache

    return from_cache(cache, cfg, layer.k_scale).float()


def _same_except_block(cfg, mine, ref, step):
    """Every byte outside the block's written slots equals the reference's (garbage slots,
    context entries and padding requests' slots untouched)."""
    flat_m = mine.reshape(-1, cfg.kv_entry).view(torch.uint8)
    flat_r = ref.reshape(-1, cfg.kv_entry).view(torch.uint8)
    keep = torch.ones(flat_m.shape[0], dtype=torch.bool)
    written = step.slot_mapping[step.slot_mapping >= 0].cpu()
    keep[written] = False
    return bool(torch.equal(flat_m[keep], flat_r[keep]))


def fault_then_reset(rank, world, group, late_rank, case):
    """A rank stalls past the deadline in a one-request step: MonoFault on every rank and
    a poisoned output; after reset() the step `case` (requests, padding, contexts) runs
    right: its output and distance to the reference."""
    from mono_runtime.errors import MonoFault

    cfg = DrafterConfig.tiny(world)
    weights = [random_weights(cfg, seed=3, rank=r) for r in range(world)]
    late = step_inputs(cfg, weights[0], 1, seed=11)
    reqs, pad, ctx = case
    step = step_inputs(cfg, weights[0], reqs, seed=12, padding=pad, context_lens=ctx)
    nb = max(late.caches[0].shape[0], step.caches[0].shape[0])
    caches = [torch.zeros((nb,) + c.shape[1:], dtype=c.dtype) for c in step.caches]
    for mine, theirs in zip(caches, late.caches, strict=True):
        mine[: theirs.shape[0]].copy_(theirs)
    runner = _runner(cfg, group, rank, caches, 3, deadline_ns=200_000_000)  # 200 polls
    outcome = {}
    try:
        runner.inject(late_rank, 2_000_000_000)
        runner.step_begin()
        out = runner(late.embeds, late.positions, late.slot_mapping, late.block_table,
                     late.seq_lens)  # fmt: skip
        try:
            runner.after_step()
            outcome["fault"] = None
        except MonoFault as err:
            outcome["fault"] = str(err)
        outcome["poisoned"] = bool(torch.isnan(out.float()).any())
        runner.inject(None)
        runner.reset()
        runner.mono.set_deadline(5_000_000_000)  # a slow interpreter rank must not fault now
        for mine, theirs in zip(caches, step.caches, strict=True):
            mine[: theirs.shape[0]].copy_(theirs)
        runner.step_begin()
        out = runner(step.embeds, step.positions, step.slot_mapping, step.block_table,
                     step.seq_lens)  # fmt: skip
        runner.after_step()
        ref = drafter_reference(
            cfg, step.embeds, step.positions, step.caches, step.block_table, step.seq_lens,
            step.slot_mapping, weights, step.live,
        )  # fmt: skip
        rows = step.live.repeat_interleave(cfg.query_len)
        outcome["out"] = out
        outcome["after_reset_err"] = rel_l2(out[rows], ref.hidden[rows])
        outcome["pad_zero"] = bool((out[~rows] == 0).all())
    finally:
        runner.close()
    return outcome


def stale_and_close(rank, world, group):
    """stale() after a re-bind (new tensors), not after the same caches or a grown block
    count at the same address; close() unmaps the peer buffer and is idempotent."""
    cfg = DrafterConfig.tiny(world)
    step = step_inputs(cfg, random_weights(cfg), 1, seed=2)
    runner = _runner(cfg, group, rank, [c.clone() for c in step.caches], 0)
    same = runner.stale(runner.caches)
    as_engine = runner.stale([c.unsqueeze(1) for c in runner.caches])
    fewer = runner.stale([c[:-1] for c in runner.caches])
    rebound = runner.stale([c.clone() for c in runner.caches])
    runner.close()
    runner.close()
    try:
        runner.stale(step.caches)
        closed_raises = False
    except RuntimeError:
        closed_raises = True
    return dict(
        same=same,
        as_engine=as_engine,
        fewer=fewer,
        rebound=rebound,
        closed=runner.mono.closed,
        closed_raises=closed_raises,
    )


def bad_inputs(rank, world, group):
    """Every bad argument of DrafterRunner.__call__ -> its ValueError message (None:
    accepted)."""
    cfg = DrafterConfig.tiny(1)
    step = step_inputs(cfg, random_weights(cfg), 2, seed=1)
    runner = _runner(cfg, group, rank, [c.clone() for c in step.caches], 0)
    e, pos, sm, bt, sl = (
        step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens
    )  # fmt: skip
    cases = [
        ("embeds", dict(embeds=e.float())),
        ("embeds", dict(embeds=e[:3])),
        ("positions", dict(positions=pos.to(torch.int32))),
        ("slot_mapping", dict(slot_mapping=sm[:-1])),
        ("block_table", dict(block_table=bt.long())),
        ("block_table", dict(block_table=bt.t())),
        ("seq_lens", dict(seq_lens=sl.long())),
        ("out", dict(out=e)),
        ("out", dict(out=torch.zeros(e.shape, dtype=torch.float32))),
    ]
    errors = []
    for arg, change in cases:
        kw = dict(embeds=e, positions=pos, slot_mapping=sm, block_table=bt, seq_lens=sl) | change
        try:
            runner(**kw)
            errors.append((arg, None))
        except ValueError as err:
            errors.append((arg, str(err)))
    runner.close()
    return errors


def _strided(cache):
    """`cache`'s shape and dtype, every other element of a wider buffer (not contiguous)."""
    wide = torch.zeros(cache.shape[:-1] + (2 * cache.shape[-1],), dtype=cache.dtype)
    return wide[..., ::2]


def refused(rank, world, group):
    """DrafterRunner's construction refusals -> (what the message must name, its text)."""
    from dataclasses import replace

    from mono_runtime.errors import MonoUnsupported

    cfg = DrafterConfig.tiny(1)
    step = step_inputs(cfg, random_weights(cfg), 1, seed=4)
    rope = cos_sin_cache(cfg)
    ok = [c.clone() for c in step.caches]
    cases = [
        ("TP size", replace(cfg, tp=2), ok, rope),
        ("layer count", cfg, ok[:1], rope),
        ("rope cache dtype", cfg, ok, rope.double()),
        ("rope cache shape", cfg, ok, rope[:, :2]),
        ("KV cache 0 shape", cfg, [c[:, :8] for c in ok], rope),
        ("KV cache 1 dtype", cfg, [ok[0], ok[1].float()], rope),
        ("KV cache 0: must be contiguous", cfg, [_strided(c) for c in ok], rope),
    ]
    cases.append(("weights.layers[0].input_layernorm", cfg, ok, rope))  # another model's
    out = []
    for what, c, caches, rp in cases:
        w = random_weights(replace(c, tp=1))
        if what.startswith("weights"):
            w = random_weights(replace(c, hidden_size=128))
        try:
            DrafterRunner(c, group, rank, "cpu", w, caches, rp).close()
            out.append((what, None))
        except MonoUnsupported as err:
            out.append((what, str(err)))
    return out


def compile_checks(rank, world, group, tp, wide):
    """Compile for sm_90 (PTX + ptxas resources, a real launch's specialization) and
    gfx950, without a GPU; the facts the parent asserts."""
    from mono_kernels_kimi.drafter import triton_build
    from mono_kernels_kimi.drafter.spec import DrafterBuild
    from mono_runtime.builds import DeviceLimits, residency_problem
    from mono_runtime.compile_check import gpu_acquires, resources_of
    from mono_runtime.sass import narrow_stream_loads, sass_of, split_broadcasts

    b = DrafterBuild(DrafterConfig.tiny(tp), wide)
    facts = {}
    k = triton_build.compile_for(b, "sm90")
    ptx = k.asm["ptx"]
    res = resources_of(k)
    facts["sys_value_store"] = "st.relaxed.sys.global.b64" in ptx
    facts["gpu_acquire"] = gpu_acquires(ptx) > 0
    facts["globaltimer"] = "%globaltimer" in ptx
    facts["spills"] = res.spill_bytes
    facts["residency"] = residency_problem(res, 132, DeviceLimits(), "drafter")
    sass = sass_of(k)
    facts["split_draws"] = split_broadcasts(sass)
    facts["narrow_stream_loads"] = narrow_stream_loads(sass)
    amdgcn = triton_build.compile_for(b, "gfx950").asm["amdgcn"]
    facts["hip_atomics"] = "global_atomic" in amdgcn or "flat_atomic" in amdgcn
    facts["hip_clock"] = "s_memrealtime" in amdgcn
    return facts


def bounded(rank, world, group, body, *args):
    """Rank body `body` (a name of this module) with every load, store and atomic of the
    interpreted kernel checked against the memory it may touch (mono_runtime.interp_bounds:
    the launch's tensors, the runner's health words and every rank's peer buffer, the
    tensors its pointer table names): (body's result, the accesses outside them)."""
    from mono_runtime.interp_bounds import checking

    global _runner
    plain = _runner

    def runner(*a, **kw):
        r = plain(*a, **kw)
        bounds.allow(r.mono.health)
        for address in r.mono.peer.addresses.tolist():
            bounds.allow(address, r.mono.peer.nbytes)
        for layer, cache in zip(r.weights.layers, r.caches, strict=True):
            for t in (layer.tensors() | {"cache": cache}).values():
                bounds.allow(t)
        return r

    with checking(record_only=True) as bounds:
        _runner = runner
        try:
            out = globals()[body](rank, world, group, *args)
        finally:
            _runner = plain
    return out, [str(v) for v in bounds.violations[:5]]


def full_rank_eager_and_graph(requests=(2, 6), context=1500, seed=0):
    """One TP8 rank's shapes of the Kimi-K3 drafter (`bench.rank_config`, at TP 1) on the
    GPU, per request count (narrow, wide): the eager launch against drafter_reference on
    the same device, then a CUDA graph captured on the same buffers, replayed on the same
    inputs (bit for bit the eager output) and on new embeddings (against the reference),
    the caches restored before each run so that every run writes the same step."""
    from mono_kernels_kimi.drafter import bench

    cfg = bench.rank_config()
    dev = torch.device("cuda")
    w = random_weights(cfg, seed=seed, device=dev)
    blocks = 1 + max(requests) * bench.blocks_of(cfg, context)
    caches = bench.random_caches(cfg, blocks, seed, dev)
    runner = DrafterRunner(cfg, None, 0, dev, w, caches, cos_sin_cache(cfg).to(dev))
    records = []
    try:
        runner.warm()
        for r in requests:
            step = bench.step_on_device(cfg, r, context, caches, seed + r, dev)
            before = [c.clone() for c in caches]
            out = torch.empty_like(step.embeds)

            def launch(step=step, out=out):
                runner.step_begin()
                runner(
                    step.embeds, step.positions, step.slot_mapping, step.block_table,
                    step.seq_lens, out=out,
                )  # fmt: skip

            def check(before=before, step=step, out=out):
                ref = drafter_reference(
                    cfg, step.embeds, step.positions, before, step.block_table, step.seq_lens,
                    step.slot_mapping, [w], step.live,
                )  # fmt: skip
                cache = max(
                    rel_l2(_values(cfg, c, layer), _values(cfg, rc, layer))
                    for c, rc, layer in zip(caches, ref.caches, w.layers, strict=True)
                )
                return rel_l2(out, ref.hidden), cache

            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                launch()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            runner.after_step()
            eager, eager_cache = check()
            eager_out = out.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launch()
            for c, b in zip(caches, before, strict=True):
                c.copy_(b)
            graph.replay()
            torch.cuda.synchronize()
            runner.after_step()
            same = torch.equal(out.view(torch.int16), eager_out.view(torch.int16))
            for c, b in zip(caches, before, strict=True):
                c.copy_(b)
            g = torch.Generator(device=dev).manual_seed(seed + 100 + r)
            step.embeds.copy_(torch.randn(step.embeds.shape, generator=g, device=dev))
            graph.replay()
            torch.cuda.synchronize()
            runner.after_step()
            replayed, replayed_cache = check()
            for c, b in zip(caches, before, strict=True):
                c.copy_(b)
            records.append(
                dict(
                    reqs=r,
                    eager=eager,
                    eager_cache=eager_cache,
                    replay_same=same,
                    graph=replayed,
                    graph_cache=replayed_cache,
                )
            )
    finally:
        runner.close()
    return records


def timeline_launch(rank, world, group, case, seed=0):
    """One launch of `case` on a timeline runner and on a plain one (the same inputs and
    caches): the timeline's rows (stamps set to -1 first, so an unstamped ticket shows),
    the spec's stage of every ticket, whether outputs and caches match bit for bit, and
    the plain runner's refusal to give a timeline."""
    from mono_kernels_kimi.drafter.spec import stage_of, tickets

    cfg = DrafterConfig.tiny(world)
    reqs, pad, ctx = case
    step = step_inputs(cfg, random_weights(cfg, seed=seed), reqs, seed=seed, padding=pad,
                       context_lens=ctx)  # fmt: skip
    got = {}
    for timeline in (True, False):
        caches = [c.clone() for c in step.caches]
        runner = _runner(cfg, group, rank, caches, seed, timeline=timeline)
        try:
            wide = reqs > 2
            if timeline:
                runner.region(wide, "timeline").view(torch.int64).fill_(-1)
            runner.step_begin()
            out = runner(
                step.embeds, step.positions, step.slot_mapping, step.block_table, step.seq_lens
            )
            runner.after_step()
            b = runner.builds[wide]
            if timeline:
                got["rows"] = runner.timeline(wide)
                got["stages"] = [stage_of(b, t)[1] for t in range(tickets(b))]
            else:
                try:
                    runner.timeline(wide)
                    got["plain_refused"] = ""
                except ValueError as err:
                    got["plain_refused"] = str(err)
            got[timeline] = (out.clone(), [c.clone() for c in caches])
        finally:
            runner.close()
    (out_t, caches_t), (out_p, caches_p) = got.pop(True), got.pop(False)
    got["same_as_plain"] = torch.equal(out_t.view(torch.int16), out_p.view(torch.int16)) and all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(caches_t, caches_p, strict=True)
    )
    return got
