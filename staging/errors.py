"""The error convention: a UserError is a refusal the user can fix (one line + hint, exit 2).

It lives in the lowest layer so that staging, plan and host all refuse the same way;
`coppelius.errors` re-exports it.
"""
from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A refusal caused by the request, not by a bug: printed as one line plus a hint, no traceback.

    Subclass it for every refusal a user can act on (bad checkpoint, bad token cache, locked path).
    """
    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"
