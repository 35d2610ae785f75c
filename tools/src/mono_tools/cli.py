"""The `mono` command: one entry point for checking a machine and timing the kernels."""

from __future__ import annotations

import argparse
import importlib
import sys

from mono_tools.errors import CommandFailed, UsageError

PACKAGES = (
    "mono_peer",
    "mono_runtime",
    "mono_kernels_minimax",
    "mono_kernels_kimi",
    "mono_tools",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (status 2), like every other one."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _version(_: argparse.Namespace) -> int:
    """Import every mono package and print its version, so a broken install shows at once."""
    for name in PACKAGES:
        module = importlib.import_module(name)
        print(f"{name:22s} {module.__version__}")
    try:
        module = importlib.import_module("mono_vllm")
        print(f"{'mono_vllm':22s} {module.__version__}")
    except ImportError as exc:  # the plugin is optional: it needs vllm
        print(f"{'mono_vllm':22s} not importable ({exc})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from mono_tools.bench.command import add_parser as add_bench
    from mono_tools.qualify.command import add_parser as add_qualify

    parser = _Parser(prog="mono", description="mono: specialized decode of large MoE models.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "version", help="import every mono package and print its version"
    ).set_defaults(handler=_version)
    add_qualify(commands)
    add_bench(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except UsageError as exc:
        print(f"mono: error: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"mono: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mono: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
