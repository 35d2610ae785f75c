"""Run `mono bench ffn|kda|k2|drafter|allreduce|gemv`: measure on the GPU, then a table on
screen, JSON and a PNG plot in the output folder. Every flag is checked against the
kernel's entry in KERNELS before anything runs. A kernel package's entry names its family
in mono_runtime's kernel registry, which says whether this install has it (the runtime's
own kernels, allreduce and gemv, are always there)."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass

from mono_tools import kernels, outputs, table
from mono_tools.errors import CommandFailed, UsageError
from mono_tools.machine import detect, require_gpu

MAX_ROWS = 1024
WEIGHT_FORMATS = ("bf16", "fp8", "fp8_frag", "mxfp4", "mxfp4_frag")  # what --format can name at all


@dataclass(frozen=True)
class Kernel:
    """What `mono bench NAME` runs and which flags it takes."""

    module: str  # has measure(args, machine) -> BenchResult
    rows: tuple[int, ...]  # the default --rows
    max_rows: int
    what: str  # how a refusal names it
    formats: tuple[str, ...] = ()  # what --format may name; () refuses --format
    ranks: bool = False  # takes --ranks
    engines: tuple[str, ...] = ()  # what --engine may name (the kernel's builds); ()
    # refuses --engine
    family: str | None = None  # its builds' family in the kernel registry

    def problem(self, args: argparse.Namespace) -> str | None:
        """Why these flags do not fit this kernel, or None."""
        too_many = [r for r in args.rows or () if r > self.max_rows]
        if too_many:
            return f"--rows {too_many}: {self.what} serves at most {self.max_rows} rows"
        if args.ranks is not None and not self.ranks:
            return f"--ranks applies to `mono bench {_taking('ranks')}` only"
        if args.engine is not None and args.engine not in self.engines:
            if not self.engines:
                return f"--engine applies to `mono bench {_taking('engines')}` only"
            return f"--engine {args.engine}: {self.what} builds are {' or '.join(self.engines)}"
        if args.format is None:
            return None
        if not self.formats:
            return f"--format applies to `mono bench {_taking('formats')}` only"
        if not set(args.format) <= set(self.formats):
            return (
                f"--format {','.join(args.format)}: {self.what} reads {' or '.join(self.formats)}"
            )
        return None


KERNELS = {
    "ffn": Kernel(
        "mono_tools.bench.ffn",
        (1, 2, 4, 8, 16),
        16,
        "the FFN kernel",
        ("mxfp4", "fp8"),
        family="ffn",
        engines=("triton", "gluon"),
    ),
    "kda": Kernel("mono_tools.bench.kda", (1, 2, 4, 8), 16, "K1", family="kda"),  # one row tile
    "k2": Kernel(
        "mono_tools.bench.k2", (1, 2, 4, 8, 16), 16, "K2", family="k2", engines=("triton", "gluon")
    ),
    # rows are requests; 8 is one launch of the wide build (the runner splits beyond)
    "drafter": Kernel("mono_tools.bench.drafter", (1, 2, 4, 8), 8, "the drafter", family="drafter"),
    "allreduce": Kernel(
        "mono_tools.bench.allreduce", (1, 2, 4, 8, 16), MAX_ROWS, "the all-reduce", ranks=True
    ),
    "gemv": Kernel("mono_tools.bench.gemv", (1, 4, 16), 16, "the GEMV", WEIGHT_FORMATS),
}


def _require_family(family: str) -> None:
    from mono_runtime.kernel import registry

    absent = kernels.load()
    if family not in registry.families():
        why = "; ".join(absent.values()) or "its package registers no build"
        raise CommandFailed(f"this install has no {family} kernel ({why})")


def _taking(what: str) -> str:
    return "|".join(name for name, k in KERNELS.items() if getattr(k, what))


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


def parse_formats(text: str) -> tuple[str, ...]:
    """`mxfp4` or `bf16,mxfp4` -> the names, each a known weight format, once."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in WEIGHT_FORMATS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {(unknown or [text])[0]!r} (choose from {', '.join(WEIGHT_FORMATS)})"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: a format appears twice")
    return tuple(names)


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
    p.add_argument(
        "--format",
        type=parse_formats,
        metavar="FORMAT[,FORMAT]",
        help="weight format(s): ffn mxfp4 (default), fp8 or both; gemv any of bf16,fp8,mxfp4,"
        "mxfp4_frag, fp8_frag (the Gluon engine; default all)",
    )
    p.add_argument("--out", default="mono-bench", metavar="DIR", help="default: ./mono-bench")
    p.add_argument("--ranks", type=int, help="allreduce: ranks, one per GPU (default: all)")
    p.add_argument(
        "--engine",
        help="ffn, k2: the build, triton or gluon (default: the runner's: gluon on sm_90+ "
        "for packed MXFP4 experts where it serves the shapes, else triton)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    kernel = KERNELS[args.kernel]
    problem = kernel.problem(args)
    if problem:
        raise UsageError(problem)
    args.rows = args.rows or kernel.rows
    machine = detect()
    require_gpu(machine, f"mono bench {args.kernel}")
    if kernel.family is not None:
        _require_family(kernel.family)
    folder = outputs.out_folder(args.out)
    result = importlib.import_module(kernel.module).measure(args, machine)

    headers, rows = result.table()
    print(
        f"mono bench {args.kernel} on {result.device}: copy bandwidth "
        f"{result.copy_gbps:.0f} GB/s; {result.settings}"
    )
    print(table.render(headers, rows, right=set(range(len(result.case_names), len(headers)))))
    json_path = folder / f"bench-{args.kernel}.json"
    png_path = folder / f"bench-{args.kernel}.png"
    outputs.write_json(json_path, result.as_dict())
    from mono_tools.bench.plot import save

    save(result, png_path)
    print(f"written: {json_path}, {png_path}")
    return 0
