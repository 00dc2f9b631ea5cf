"""The error convention, re-exported for the host; it lives in `staging.errors` (lowest layer)."""
from staging.errors import EXIT_USER_ERROR, UserError

__all__ = ["EXIT_USER_ERROR", "UserError"]
