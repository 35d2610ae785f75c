"""Time many FFN build variants in one GPU run: a table for tuning, not a guess.

Each variant is (MONO_FFN_TILES overrides, experts subset, layout: ``frag`` (the Gluon
build: mxfp4-frag or fp8-frag), ``rot`` (the Triton build: mxfp4-rot, or FP8's fp8-b128
as it is) or MXFP4's checkpoint ``k32``); each is built, packed and timed under graph
replay over `layers` distinct layers, like `bench`, with no op-by-op path.
Subsets isolate stages: `shared` runs the seam, router, route and the shared expert only;
`routed` the routed experts only. From a shell:

    python3 -m mono_kernels_minimax.ffn.tune --rows 1,16 --format mxfp4 \\
        --variants "|stages=2|uks=2,uks0=4" --experts all,shared,routed \\
        --layouts frag,rot,k32 [--timeline DIR]
"""

from __future__ import annotations

import argparse
import os

import torch
from mono_runtime.timing import graph_time

from ..formats import WeightFormat
from .bench import random_layer, rank_config
from .runner import FfnRunner
from .spec import INPUTS, TILES_ENV, Experts

# a layout -> (FfnRunner's pack, engine): the build that streams it
LAYOUTS = {"frag": (True, "gluon"), "rot": (True, "triton"), "k32": (False, "triton")}


def time_variant(
    tiles: str,
    experts: Experts,
    fmt: WeightFormat,
    rows,
    layers: int,
    device,
    timeline: str | None = None,
    layout: str = "frag",
) -> dict[int, float]:
    """us per launch at each S for one variant (the environment override set meanwhile).
    With `timeline` (a folder): timeline builds; each S's last launch is summarised on
    screen and drawn to timeline-S.png there."""
    os.environ[TILES_ENV] = tiles
    pack, engine = LAYOUTS[layout]
    cfg = rank_config()
    g = torch.Generator(device=device).manual_seed(0)
    runner = FfnRunner(
        cfg,
        fmt,
        None,
        0,
        1,
        device,
        widths=rows,
        experts=experts,
        timeline=timeline is not None,
        pack=pack,
        engine=engine,
    )
    try:
        ws = [runner.pack(random_layer(cfg, fmt, n, device)) for n in range(layers)]
        runner.warm()
        out = {}
        for s in rows:
            part = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
            res = torch.randn(s, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
            slots = torch.arange(s, dtype=torch.int64, device=device)
            o, r = torch.empty_like(part), torch.empty_like(res)

            def step(part=part, res=res, slots=slots, o=o, r=r):
                runner.step_begin()
                for w in ws:
                    runner(part, res, w, slots, out=o, residual_out=r)

            out[s] = graph_time(step, reps=10) / layers * 1e6
            runner.after_step()
            if timeline is not None:
                from mono_runtime.timeline import show, stage_deps

                title = f"{fmt.value} {experts.value} [{tiles}] S={s}"
                rows = runner.timeline(s)
                show(
                    rows,
                    f"timeline {title} (us per item of the graph's last launch)",
                    os.path.join(
                        timeline, f"timeline-{fmt.value}-{layout}-{experts.value}-{s}.png"
                    ),
                    title,
                    stage_deps(rows, INPUTS),
                )
        return out
    finally:
        runner.close()
        os.environ.pop(TILES_ENV, None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,16")
    p.add_argument("--format", default="mxfp4")
    p.add_argument("--variants", default="", help="'|'-separated MONO_FFN_TILES strings")
    p.add_argument("--experts", default="all")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument(
        "--layouts", default="frag", help="frag (Gluon), rot (Triton), k32 (MXFP4 as loaded)"
    )
    p.add_argument("--timeline", metavar="DIR", help="timeline builds; pictures in DIR")
    a = p.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",")]
    device = torch.device("cuda", torch.cuda.current_device())
    for layout in a.layouts.split(","):
        if layout not in LAYOUTS:
            p.error(f"--layouts: {layout!r} is not one of {', '.join(LAYOUTS)}")
        for tiles in a.variants.split("|"):
            for experts in a.experts.split(","):
                try:
                    got = time_variant(
                        tiles,
                        Experts(experts),
                        WeightFormat(a.format),
                        rows,
                        a.layers,
                        device,
                        a.timeline,
                        layout,
                    )
                    cells = "  ".join(f"S={s}: {us:7.1f} us" for s, us in got.items())
                except Exception as err:  # noqa: BLE001 (a variant that fails is a row)
                    cells = f"ERROR {type(err).__name__}: {str(err).splitlines()[0][:160]}"
                name = f"{a.format} {layout}"
                print(f"{name:10s} {experts:7s} [{tiles or 'default'}]  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
