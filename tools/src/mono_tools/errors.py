"""Errors a user can cause and fix: the command ends with one line on stderr and status 2."""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in how `mono` was called or where it runs (bad argument, missing hardware).

    `main` prints it as one line, without a traceback: the user needs the fix, not our stack.
    """


class CommandFailed(Exception):
    """The command could not finish its work (a rank crashed, a kernel refused): status 1.

    Shown as one line too; the detail a developer needs goes in the JSON or the log above.
    """
