"""Live progress of a long command: a spinner line per step on a terminal, plain lines
otherwise (CI logs and pipes get one line when a step starts and one when it ends)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

SPINNER = "|/-\\"
MARKS = {"pass": "ok", "fail": "FAIL", "skip": "skip", "not run": "--"}


class Progress:
    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.name: str | None = None
        self.started = 0.0
        self.frame = 0

    def start(self, name: str) -> None:
        self.name, self.started, self.frame = name, time.monotonic(), 0
        if self.tty:
            self.tick()
        else:
            self._line(f"..   {name}")

    def tick(self) -> None:
        """Redraw the spinner and elapsed time (terminal only); call it often while waiting."""
        if not (self.tty and self.name):
            return
        elapsed = time.monotonic() - self.started
        spin = SPINNER[self.frame % len(SPINNER)]
        self.frame += 1
        self.stream.write(f"\r{spin}    {self.name}  {elapsed:5.1f} s\x1b[K")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays (e.g. a worker's setup message), printed above the spinner."""
        if self.tty:
            self.stream.write("\r\x1b[K")
        self._line(f"     {text}")
        if self.name:
            self.tick()

    def finish(self, name: str, status: str, seconds: float, detail: str = "") -> None:
        mark = MARKS.get(status, status)
        if self.tty:
            self.stream.write("\r\x1b[K")
        tail = f"  {detail}" if detail else ""
        self._line(f"{mark:4s} {name}  {seconds:5.1f} s{tail}")
        self.name = None

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
