"""Where results go (a JSON file, an output folder), checked before any work starts so that a
long run never ends in a failed write."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mono_tools.errors import CommandFailed, UsageError


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


class JsonFile:
    """A JSON result file opened, and shown to take a write, before any work runs: a full
    disk or an unwritable file is a usage error up front, not a traceback after the run."""

    PENDING = '{"complete": false}\n'  # what the file holds until the results replace it

    def __init__(self, path: str) -> None:
        self.path = json_target(path)
        try:
            self._file = open(self.path, "w")  # noqa: SIM115 (kept open for the whole run)
            if self._file.seekable():
                self._file.write(self.PENDING)
            self._file.flush()
        except OSError as exc:
            raise UsageError(f"--json {path}: cannot write there ({exc.strerror or exc})") from None

    def write(self, data: dict) -> None:
        """Replace the placeholder with `data`; CommandFailed when the write fails."""
        try:
            with self._file:
                if self._file.seekable():
                    self._file.seek(0)
                    self._file.truncate()
                self._file.write(_text(data))
        except OSError as exc:
            raise CommandFailed(
                f"--json {self.path}: writing the results failed ({exc.strerror or exc})"
            ) from None


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


def _text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write_json(target: Path, data: dict) -> None:
    target.write_text(_text(data))
