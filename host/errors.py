"""The host's errors, at the bottom so that every layer raises them and none imports another for them.

A refusal is a `UserError` (the convention lives in `coppelius.staging.errors`, the lowest layer:
one line with a hint, exit 2); a backend that cannot run here is a refusal of its own kind; a device
fault is not a refusal (the run ends with exit 1 and the notifier says why).
"""
from __future__ import annotations

from coppelius.staging.errors import UserError


class DeviceError(RuntimeError):
    """A device fault: the driver reported an error, or a submission misbehaved."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class BackendUnavailable(UserError):
    """The requested backend cannot run here (no driver, no GPU, no Triton)."""
