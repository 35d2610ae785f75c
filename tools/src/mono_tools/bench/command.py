"""Run `mono bench ffn|kda|allreduce`: measure on the GPU, then a table on screen, JSON and a
PNG plot in the output folder."""

from __future__ import annotations

import argparse
import importlib

from mono_tools import outputs, table
from mono_tools.errors import UsageError
from mono_tools.machine import detect, require_gpu

KERNELS = {  # name -> (module with measure(args, machine) -> BenchResult, default rows)
    "ffn": ("mono_tools.bench.ffn", (1, 2, 4, 8, 16)),
    "kda": ("mono_tools.bench.kda", (1, 2, 4, 8)),
    "allreduce": ("mono_tools.bench.allreduce", (1, 2, 4, 8, 16)),
}
MAX_ROWS = 1024


def parse_rows(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): positive, distinct, in increasing order."""
    try:
        rows = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of row counts; give comma-separated integers, e.g. 1,2,4"
        ) from None
    if not rows:
        raise argparse.ArgumentTypeError("no row counts given; give e.g. 1,2,4,8,16")
    bad = [r for r in rows if not 1 <= r <= MAX_ROWS]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r}: each row count must be 1..{MAX_ROWS}")
    if len(set(rows)) != len(rows):
        raise argparse.ArgumentTypeError(f"{text!r}: a row count appears twice")
    return tuple(sorted(rows))


def add_parser(commands) -> None:
    p = commands.add_parser(
        "bench",
        help="time a kernel under graph replay against the op-by-op path (needs a GPU)",
        description="Time a kernel under CUDA/HIP graph replay against the op-by-op path of "
        "the same layer in the same run, with the memory limit from the copy bandwidth "
        "measured in that run. Writes a table, bench-KERNEL.json and bench-KERNEL.png.",
    )
    p.add_argument("kernel", choices=tuple(KERNELS))
    p.add_argument("--rows", type=parse_rows, help="row counts, e.g. 1,2,4,8,16")
    p.add_argument("--format", choices=("mxfp4", "fp8"), help="expert weight format (ffn)")
    p.add_argument("--out", default="mono-bench", metavar="DIR", help="default: ./mono-bench")
    p.add_argument("--ranks", type=int, help="allreduce: ranks, one per GPU (default: all)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    machine = detect()
    require_gpu(machine, f"mono bench {args.kernel}")
    module_name, default_rows = KERNELS[args.kernel]
    args.rows = args.rows or default_rows
    if args.ranks is not None and args.kernel != "allreduce":
        raise UsageError("--ranks applies to `mono bench allreduce` only")
    if args.format is not None and args.kernel == "allreduce":
        raise UsageError("--format applies to `mono bench ffn` and `mono bench kda`")
    folder = outputs.out_folder(args.out)
    result = importlib.import_module(module_name).measure(args, machine)

    headers, rows = result.table()
    print(
        f"mono bench {args.kernel} on {result.device}: copy bandwidth "
        f"{result.copy_gbps:.0f} GB/s; {result.settings}"
    )
    print(table.render(headers, rows, right=set(range(len(headers)))))
    json_path = folder / f"bench-{args.kernel}.json"
    png_path = folder / f"bench-{args.kernel}.png"
    outputs.write_json(json_path, result.as_dict())
    from mono_tools.bench.plot import save

    save(result, png_path)
    print(f"written: {json_path}, {png_path}")
    return 0
