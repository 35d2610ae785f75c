"""Reproduce the fault of K2's Gluon build on an NVIDIA GPU, past its refusal.

`K2Gluon.supports` refuses every GPU (`K2Gluon.DEFECT`); this script lifts that one
refusal in its own process and runs one eager step of a TP8 rank's shapes at TP 1, then
prints what happened: the MonoFault's give-up records (which region, which pair, what was
seen), or the CUDA error, or the output's error against the plain-torch reference. With
`--programs 1` one program runs every item in ticket order (stop 37: it gives up at ar1
pair 0 while K2's Triton build passes the same run); `--stages-after NAME` makes every
stage helper after NAME a no-op (a bisection: the items still mark themselves done);
`--dump N` prints the first N ar1 pairs of row 0 as the launch left them (tag, payload),
and `--engine triton` runs the Triton build the same way, to compare.

    python3 tools/k2_gluon_repro.py --rows 1 [--programs N] [--stages-after _col] [--dump 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path

# the stage helpers of k2/triton_build.py in ticket order; those returning a clock
STAGES = (
    "_oproj _col _mix _norm _router _latdown _shup _shdown _gather _route _union _up "
    "_down _dsum _lred _upproj _final"
).split()
RETURNS = {"_shdown", "_down", "_upproj"}


def _noop(fn, name: str, folder: Path):
    """A @triton.jit function with `fn`'s parameters that does nothing (Triton compiles
    only functions defined in a file, so it is written to one)."""
    import triton

    params = [
        p.name + (": tl.constexpr" if "constexpr" in str(p.annotation) else "")
        for p in inspect.signature(fn.fn).parameters.values()
    ]
    body = "    return tl.cast(0, tl.int64)\n" if name in RETURNS else "    pass\n"
    path = folder / f"noop{name}.py"
    path.write_text(f"import triton.language as tl\n\n\ndef {name}({', '.join(params)}):\n{body}")
    spec = importlib.util.spec_from_file_location(f"noop{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return triton.jit(getattr(module, name))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--programs", type=int, default=None, help="default: the runner's")
    parser.add_argument("--stages-after", choices=STAGES, help="no-op every later stage")
    parser.add_argument("--dump", type=int, default=0, help="print the first N ar1 pairs")
    parser.add_argument("--engine", default="gluon", choices=("gluon", "triton"))
    args = parser.parse_args(argv)

    import torch
    from mono_kernels_kimi.k2 import triton_build
    from mono_kernels_kimi.k2.bench import LAYER_IDX, random_layer, rank_config
    from mono_kernels_kimi.k2.build import K2Gluon
    from mono_kernels_kimi.k2.inputs import step_inputs
    from mono_kernels_kimi.k2.reference import k2_reference
    from mono_kernels_kimi.k2.runner import K2Runner
    from mono_kernels_kimi.k2.spec import peer_layout
    from mono_runtime import protocol as P

    real = K2Gluon.supports
    K2Gluon.supports = lambda self, target: (
        None if real(self, target) == K2Gluon.DEFECT else real(self, target)
    )
    if args.stages_after:
        folder = Path(tempfile.mkdtemp(prefix="k2-noop-"))
        for name in STAGES[STAGES.index(args.stages_after) + 1 :]:
            setattr(triton_build, name, _noop(getattr(triton_build, name), name, folder))
    cfg, s = rank_config(), args.rows
    runner = K2Runner(cfg, None, 0, "cuda", widths=(s,), engine=args.engine, programs=args.programs)
    w = runner.pack(random_layer(cfg, 2, "cuda"))
    runner.warm()
    step = step_inputs(cfg, s, seed=3, device="cuda")
    prefix = step.prefix.clone()
    runner.step_begin()
    try:
        out = runner(step.cores[0], prefix, step.blocks, w, step.slots, LAYER_IDX, final=True)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 (the fault is what this reports)
        print(f"launch failed: {type(err).__name__}: {err}")
        return 1
    if args.dump:  # ar1[rank 0][row 0][pair], as this rank's peer buffer holds it
        start = P.PEER_HEAD + peer_layout(cfg)["ar1"][0]
        words = runner.mono.peer.bytes[start : start + 8 * args.dump].view(torch.int64)
        for i, word in enumerate(words.tolist()):
            tag, payload = P.unpack_pair(word)
            lo, hi = (
                torch.tensor([payload - (payload >> 31 << 32)], dtype=torch.int32)
                .view(torch.bfloat16)
                .tolist()
            )
            print(f"ar1 pair {i}: tag {P.decode_tag(tag)} ({tag:#010x}), bf16 {lo:.4g} {hi:.4g}")
    try:
        runner.after_step()
    except Exception as err:  # noqa: BLE001
        print(f"step gave up: {err}")
        return 1
    if args.stages_after:
        print(f"no fault with every stage after {args.stages_after} a no-op")
        return 0
    ref = k2_reference(cfg, step.cores, step.prefix, step.blocks, [w], LAYER_IDX, step.live)
    a, b = out.double(), ref.out.double()
    print(f"no fault; out rel. L2 error {((a - b).norm() / b.norm()).item():.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
