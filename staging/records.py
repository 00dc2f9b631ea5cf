"""Binary records of CONTRACT §7–§8 as little-endian numpy structured dtypes, with pack/unpack.

Each record is one `Record` object: its dtype (explicit offsets, so the layout is the contract's table,
not numpy's packing), `pack(**fields) -> bytes`, `unpack(buffer) -> dict` and `view(buffer)`,
a zero-copy structured view of one or more records in a writable buffer.
"""
from __future__ import annotations

import numpy as np


class RecordError(ValueError):
    """A buffer is not a valid record (wrong size, bad field value)."""


class Record:
    def __init__(self, name: str, fields: list[tuple[str, str, int]], itemsize: int):
        self.name = name
        self.dtype = np.dtype({"names": [f[0] for f in fields],
                               "formats": [f[1] for f in fields],
                               "offsets": [f[2] for f in fields],
                               "itemsize": itemsize})
        self.itemsize = itemsize
        self.fields = tuple(f[0] for f in fields)

    def offset(self, field: str) -> int:
        return self.dtype.fields[field][1]

    def zeros(self) -> np.ndarray:
        return np.zeros((), self.dtype)

    def pack(self, **values) -> bytes:
        unknown = set(values) - set(self.fields)
        if unknown:
            raise RecordError(f"{self.name}: unknown field(s) {sorted(unknown)}; "
                              f"fields are {list(self.fields)}")
        rec = self.zeros()
        for k, v in values.items():
            if isinstance(v, str):
                v = v.encode("ascii")
            rec[k] = v
        return rec.tobytes()

    def unpack(self, buffer) -> dict:
        data = memoryview(buffer).cast("B")
        if len(data) != self.itemsize:
            raise RecordError(f"{self.name}: {len(data)} bytes, expected {self.itemsize}")
        rec = np.frombuffer(data, self.dtype, count=1)[0]
        out = {}
        for k in self.fields:
            v = rec[k]
            if isinstance(v, np.ndarray):
                out[k] = v.copy()
            elif isinstance(v, bytes):
                out[k] = _fixed_bytes(data, self, k)
            else:
                out[k] = v.item()
        return out

    def view(self, buffer, count: int | None = None, offset: int = 0) -> np.ndarray:
        """Zero-copy structured view of `count` records at `offset` in `buffer`."""
        arr = np.frombuffer(buffer, np.uint8)
        n = count if count is not None else (arr.size - offset) // self.itemsize
        return arr[offset:offset + n * self.itemsize].view(self.dtype)


def _fixed_bytes(data: memoryview, rec: Record, field: str) -> bytes:
    # numpy strips trailing NULs from S fields; return the exact bytes of the field
    start = rec.offset(field)
    return bytes(data[start:start + rec.dtype.fields[field][0].itemsize])


U32, U16, U64, I64 = "<u4", "<u2", "<u8", "<i8"

SEMAPHORE_RECORD = Record("semaphore record", [
    ("payload", U32, 0), ("zero", U32, 4), ("timestamp", U64, 8)], 16)

SEMAPHORE_SLOT = Record("semaphore slot", [
    ("final_payload", U32, 0), ("final_zero", U32, 4), ("final_timestamp", U64, 8),
    ("prelaunch_payload", U32, 16), ("prelaunch_zero", U32, 20), ("prelaunch_timestamp", U64, 24),
], 32)

TIMESTAMP_ENTRY = Record("timestamp entry", [
    ("submission", U32, 0), ("sequence", U32, 4), ("context", U64, 8),
    ("host_issue_ns", U64, 16), ("device_prelaunch_ns", U64, 24), ("device_final_ns", U64, 32),
    ("host_fence_ns", U64, 40), ("host_wall_issue_ns", U64, 48), ("step", U32, 56),
    ("flags", U32, 60)], 64)
TIMESTAMP_NO_STEP = 0xFFFFFFFF
FLAG_FENCE_OBSERVED = 1 << 0
FLAG_ERROR = 1 << 1

ERROR_NOTIFIER = Record("error notifier", [
    ("time_ns", U64, 0), ("info32", U32, 8), ("info16", U16, 12), ("status", U16, 14),
    ("sequence", U32, 16), ("step", U32, 20), ("reason", "S40", 24)], 64)
NOTIFIER_STATUS_NONE = 0
NOTIFIER_STATUS_ERROR = 0xFFFF
NOTIFIER_NO_STEP = 0xFFFFFFFF
INFO_FENCE_TIMEOUT = 0x10001
INFO_MARKER_SURVIVED = 0x10002
INFO_HOST_IO = 0x10003
INFO_TOKEN_ID = 0x10004         # the update's cross_entropy marked a row: an id outside [0, V)
INFO_NAMES = {INFO_FENCE_TIMEOUT: "fence timeout", INFO_MARKER_SURVIVED: "record marker survived",
              INFO_HOST_IO: "host I/O", INFO_TOKEN_ID: "token id outside the vocabulary"}
#                                                  info32 codes of the host; others are CUresults

STATUS_MAGIC = b"COPPSTAT"
STATUS_VERSION_1 = 1            # CONTRACT §8's first layout: STATUS_BLOCK
STATUS_VERSION = 2              # what a run writes: STATUS_BLOCK_V2 (the GPU and host that ran)
STATUS_VERSIONS = (STATUS_VERSION_1, STATUS_VERSION)     # what the reader reads
OUTCOME_COMPLETED, OUTCOME_DEVICE_ERROR, OUTCOME_INTERRUPTED, OUTCOME_HOST_ERROR = 0, 1, 2, 3
OUTCOMES = {0: "completed", 1: "device error", 2: "interrupted", 3: "host error"}
BACKEND_CUDA, BACKEND_INTERPRET = 1, 2
BACKENDS = {1: "cuda", 2: "interpret"}

STATUS_BLOCK = Record("status block", [
    ("magic", "S8", 0), ("version", U32, 8), ("outcome", U32, 12), ("c0", U64, 16),
    ("steps_planned", U64, 24), ("steps_completed", U64, 32), ("update_count", U64, 40),
    ("gp_get", U32, 48), ("gp_put", U32, 52), ("publications", U32, 56), ("backend", U32, 60),
    ("wall_ns", U64, 64), ("predictions", ("<u4", (3, 2)), 72),
    ("compute_capability", U32, 96), ("driver_version", U32, 100),
    ("checkpoint_sha256", ("u1", (32,)), 104), ("device_name", "S24", 136)], 160)

# Version 2 (FORMATS §4): the GPU and the host that ran, in the same 160 bytes.  Every field the
# reader locates the block by (magic, version, outcome, c0, steps_planned, steps_completed, gp_get,
# gp_put) and publications, backend, wall_ns and device_name keep their version-1 offsets;
# update_count (= c0 + steps_completed) gives its 8 bytes to the PCI bus id, the predictions'
# valid flags move into their tokens' top bit, and the last checkpoint's SHA-256 keeps its first
# 8 bytes, which leaves room for the GPU's UUID and 20 bytes of host name.
STATUS_BLOCK_V2 = Record("status block v2", [
    ("magic", "S8", 0), ("version", U32, 8), ("outcome", U32, 12), ("c0", U64, 16),
    ("steps_planned", U64, 24), ("steps_completed", U64, 32),
    ("pci_domain", U32, 40), ("pci_bus", "u1", 44), ("pci_device", "u1", 45),
    ("pci_function", "u1", 46), ("identity_flags", "u1", 47),
    ("gp_get", U32, 48), ("gp_put", U32, 52), ("publications", U32, 56), ("backend", U32, 60),
    ("wall_ns", U64, 64), ("predictions", ("<u4", (3,)), 72),
    ("compute_capability", U32, 84), ("driver_version", U32, 88),
    ("gpu_uuid", ("u1", (16,)), 92), ("checkpoint_sha256", ("u1", (8,)), 108),
    ("host_name", "S20", 116), ("device_name", "S24", 136)], 160)
IDENTITY_GPU = 1 << 0               # identity_flags: the UUID and PCI bus id were read off a GPU
IDENTITY_HOST_TRUNCATED = 1 << 1    # identity_flags: the host name was longer than its 20 bytes
PREDICTION_VALID_BIT = 1 << 31      # v2 predictions: token | valid << 31
HOST_NAME_BYTES = STATUS_BLOCK_V2.dtype["host_name"].itemsize
DEVICE_NAME_BYTES = STATUS_BLOCK_V2.dtype["device_name"].itemsize
DIGEST_PREFIX_BYTES = STATUS_BLOCK_V2.dtype["checkpoint_sha256"].itemsize
IDENTITY_FIELDS = ("gpu_uuid", "pci_domain", "pci_bus", "pci_device", "pci_function",
                   "identity_flags", "host_name")      # version 2's: which GPU and host ran

STAT_RECORD = Record("stat record", [
    ("st_dev", U64, 0), ("st_ino", U64, 8), ("st_size", U64, 16), ("st_mode", U32, 24),
    ("st_nlink", U32, 28), ("st_uid", U32, 32), ("st_gid", U32, 36), ("st_atime_ns", I64, 40),
    ("st_mtime_ns", I64, 48), ("st_ctime_ns", I64, 56), ("st_blocks", U64, 64),
    ("st_blksize", U64, 72), ("update_count", U64, 80), ("zero0", U64, 88),
    ("gp_get", U32, 96), ("gp_put", U32, 100), ("semaphore_word", U32, 104), ("zero1", U32, 108),
    ("payload_sha256", ("u1", (32,)), 112), ("zero2", ("u1", (16,)), 144)], 160)

PREDICTION = Record("prediction", [("token", U32, 0), ("valid", U32, 4)], 8)

ALL = (SEMAPHORE_RECORD, SEMAPHORE_SLOT, TIMESTAMP_ENTRY, ERROR_NOTIFIER, STATUS_BLOCK, STATUS_BLOCK_V2,
       STAT_RECORD)
