"""Where results go (a JSON file, an output folder), checked before any work starts so that a
long run never ends in a failed write."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mono_tools.errors import UsageError


def json_target(path: str) -> Path:
    """A JSON file path whose folder exists and is writable."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--json {path}: is a folder; give a file path")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"--json {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"--json {path}: not writable")
    return target


def out_folder(path: str) -> Path:
    """An output folder, created if needed, that this process can write into."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".mono-write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write there ({exc.strerror or exc})") from None
    return folder


def write_json(target: Path, data: dict) -> None:
    target.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
