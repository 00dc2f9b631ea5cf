"""Test helpers for any backend: the whole payload back through the transfer window.

Uploads go through `Backend.upload_payload` (the run loop's own path); this is its mirror, which
only tests need.
"""
from __future__ import annotations

import numpy as np

from coppelius.backends.base import window_chunks


def download_payload(backend) -> np.ndarray:
    """The device payload (P, M, V) as bytes, one transfer-window chunk at a time."""
    out = np.empty(backend.profile.payload_bytes, np.uint8)       # (payload_bytes,)
    for offset, n in window_chunks(out.size):
        backend.download_chunk(offset, n)
        out[offset:offset + n] = backend.staging.transfer[:n]
    return out
