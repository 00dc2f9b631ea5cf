"""Typed zero-copy numpy views of the staging region over any writable buffer.

The buffer is plain memory (`allocate_host`) in tests and the interpret backend, and the
device-mapped pinned region (wrapped by cffi) on the cuda backend; the views are the same.
"""
from __future__ import annotations

import numpy as np

from coppelius.staging import layout as L
from coppelius.staging import records as R


def allocate_host() -> np.ndarray:
    """An 8 MiB page-aligned host buffer, poisoned like a fresh staging region."""
    raw = np.empty(L.REGION_BYTES + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    buf = raw[start:start + L.REGION_BYTES]
    poison(buf)
    return buf


def poison(buffer, offset: int = 0, size: int | None = None) -> None:
    """Fill bytes with the 0xA5 poison so a kernel that skips a write is caught."""
    arr = np.frombuffer(buffer, np.uint8) if not isinstance(buffer, np.ndarray) else buffer
    end = arr.size if size is None else offset + size
    arr[offset:end] = L.POISON_BYTE


class StagingViews:
    """Named views of the staging fields.  Every array aliases `buffer`; nothing is copied.

    The result file's sections are these views as bytes (`record_forward`, `loss_record`,
    `loss_block`, `record_final`, `semaphores`, `error_notifier`): writers take any array."""

    def __init__(self, buffer, profile):
        raw = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, np.uint8)
        raw = raw.view(np.uint8).reshape(-1)
        if raw.size < L.REGION_BYTES:
            raise ValueError(f"staging buffer has {raw.size} bytes, needs {L.REGION_BYTES}")
        if not raw.flags.writeable:
            raise ValueError("staging buffer is read-only")
        L.check_layout(profile)
        self.raw = raw
        self.profile = profile
        T, V = profile.context, profile.vocab
        self.inputs = self.u32(L.INPUTS, T)                                  # (T,)
        self.targets = self.u32(L.TARGETS, T)                                # (T,)
        self.semaphores = R.SEMAPHORE_SLOT.view(raw, len(L.SUBMISSIONS), L.SEMAPHORES)  # (3,)
        self.first_semaphore_word = self.u32(L.SEMAPHORES, 1)   # (1,) the stat record's (CONTRACT §9)
        self.error_notifier = R.ERROR_NOTIFIER.view(raw, 1, L.ERROR_NOTIFIER)  # (1,)
        self.doorbell = self.u32(L.DOORBELL, 1)                              # (1,)
        self.loss_block = self.f32(L.LOSS_BLOCK, L.LOSS_BLOCK_BYTES // 4).reshape(
            L.LOSS_WINDOWS, L.LOSS_WINDOW_WORDS)                            # (4, 1024)
        self.loss_record = self.f32(L.LOSS_RECORD, L.LOSS_RECORD_BYTES // 4)  # (1024,)
        self.predictions = self.u32(L.PREDICTIONS, 2 * L.PREDICTION_COUNT).reshape(
            L.PREDICTION_COUNT, 2)                                           # (3, {token, valid})
        self.record_forward = self.f32(L.record_forward_offset(profile), 3 * V).reshape(3, V)
        self.record_final = self.f32(L.record_final_offset(profile), V)     # (V,)
        self.transfer = raw[L.TRANSFER_WINDOW:L.TRANSFER_WINDOW + L.TRANSFER_WINDOW_BYTES]

    def bytes_at(self, offset: int, size: int) -> np.ndarray:
        return self.raw[offset:offset + size]

    def u32(self, offset: int, count: int) -> np.ndarray:
        return self.raw[offset:offset + 4 * count].view("<u4")

    def f32(self, offset: int, count: int) -> np.ndarray:
        return self.raw[offset:offset + 4 * count].view("<f4")

    def write_marker(self, offset: int) -> None:
        self.raw[offset:offset + len(L.RECORD_MARKER)] = np.frombuffer(L.RECORD_MARKER, np.uint8)

    def marker_survived(self, offset: int) -> bool:
        return bytes(self.raw[offset:offset + len(L.RECORD_MARKER)]) == L.RECORD_MARKER
