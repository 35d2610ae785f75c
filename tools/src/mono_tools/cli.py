"""The `mono` command: one entry point for checking a machine and timing the kernels."""

from __future__ import annotations

import argparse
import importlib
import sys

PACKAGES = (
    "mono_peer",
    "mono_runtime",
    "mono_kernels_minimax",
    "mono_kernels_kimi",
    "mono_tools",
)


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
    parser = argparse.ArgumentParser(
        prog="mono", description="mono: specialized decode of large MoE models."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version", help="import every mono package and print its version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"version": _version}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
