"""Errors a user can cause and fix: the command ends with one line on stderr and status 2."""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in how `mono` was called or where it runs (bad argument, missing hardware).

    `main` prints it as one line, without a traceback: the user needs the fix, not our stack.
    """
