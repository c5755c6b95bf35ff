"""One error type for every user mistake, so the CLI can print it and exit 2 without a traceback."""

from __future__ import annotations


class TpplanError(Exception):
    """A problem with the user's input: what was wrong, why, and how to fix it.

    Every message a user sees names the input (file, field or option), the reason and the fix.
    """

    def __init__(self, where: str, reason: str, fix: str) -> None:
        self.where = where
        self.reason = reason
        self.fix = fix
        super().__init__(f"{where}: {reason}. Fix: {fix}")
