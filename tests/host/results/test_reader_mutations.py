"""The three readers against mutated files (hypothesis, derandomized).

Checkpoint, token cache and result file each get bit flips, truncations, appended bytes and
rewritten header fields — for the checkpoint *resealed* (the header digest recomputed after the
edit, so that the identity, size and chunk checks are reached, not just the digest).  Every call
must either succeed or raise the reader's refusal (one line, with a hint); nothing else may escape,
no call may take more than a second, and none may allocate more than the file's size plus a small
constant (tracemalloc's peak; numpy reports its buffers to tracemalloc).
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coppelius import checkpoints as ckpt
from coppelius.checkpoints import format as CF
from coppelius.results import reader as RF
from coppelius.plan import profiles
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS
from coppelius.staging import tokens as tk

from tests.support.result_synth import synthesize

TINY = profiles.get("tiny")
SLACK = 256 * 1024              # bytes beyond the file's size: executor, hashers, headers, views
CALL_S = 1.0
MUTATE = settings(max_examples=60, deadline=5000, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def measured(fn, limit: int):
    """fn() under tracemalloc: returns its value; the peak and the time must stay in bounds."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert elapsed <= CALL_S, f"{fn.__name__} took {elapsed:.2f} s"
        assert peak <= limit + SLACK, f"{fn.__name__} allocated {peak:,} B for a {limit:,} B file"


def only_refuses(fn, refusal, limit: int):
    """The call succeeds (returns True) or raises `refusal` in one line with a hint (False)."""
    try:
        measured(fn, limit)
    except refusal as e:
        assert str(e) and "\n" not in str(e) and e.hint, repr(e)
        return False
    return True


def flips(size: int):
    return st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 7)), min_size=1,
                    max_size=8)


def flipped(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for pos, bit in edits:
        buf[pos] ^= 1 << bit
    return bytes(buf)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("mutations")


# ------------------------------------------------------------------------------ checkpoint

@functools.lru_cache(1)
def checkpoint_bytes() -> bytes:
    import tempfile
    import os
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    with tempfile.TemporaryDirectory() as d:
        ckpt.publish(os.path.join(d, "c"), TINY, P, P * 2, P * 3, update_count=5)
        with open(os.path.join(d, "c"), "rb") as f:
            return f.read()


# header fields a reseal rewrites: (offset, struct format)
CHECKPOINT_FIELDS = [(CF.OFF_VERSION, "<I"), (CF.OFF_HEADER_BYTES, "<I"), *[(off, fmt) for _, off,
                     fmt, _ in CF._FIELDS], (CF.IDENTITY_BLOCK, "<I"), (CF.IDENTITY_BLOCK + 60, "<I"),
                     (CF.DIGEST_TABLE, "<Q"), (CF.DIGEST_TABLE + 32, "<Q")]


def resealed(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for k, value in edits:
        off, fmt = CHECKPOINT_FIELDS[k % len(CHECKPOINT_FIELDS)]
        size = struct.calcsize(fmt)
        struct.pack_into(fmt, buf, off, value % (1 << (8 * size)))
    buf[CF.HEADER_DIGEST:CF.HEADER_BYTES] = hashlib.sha256(bytes(buf[:CF.HEADER_DIGEST])).digest()
    return bytes(buf)


def small_values():
    # boundary values, the real sizes ± 1, and anything
    real = [TINY.payload_bytes, TINY.chunk_bytes, TINY.chunk_count, TINY.parameter_count]
    return st.one_of(st.sampled_from([0, 1, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1]
                                     + [r + d for r in real for d in (-1, 1)]),
                     st.integers(0, 2 ** 64 - 1))


def checkpoint_mutations():
    size = len(checkpoint_bytes())
    return st.one_of(
        st.tuples(st.just("flip header"), flips(CF.HEADER_BYTES)),
        st.tuples(st.just("flip payload"), st.lists(st.tuples(
            st.integers(CF.HEADER_BYTES, size - 1), st.integers(0, 7)), min_size=1, max_size=4)),
        st.tuples(st.just("truncate"), st.integers(0, size - 1)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=4096)),
        st.tuples(st.just("reseal"), st.lists(st.tuples(st.integers(0, 99), small_values()),
                                              min_size=1, max_size=3)))


def mutate_checkpoint(kind, arg) -> bytes:
    data = checkpoint_bytes()
    if kind.startswith("flip"):
        return flipped(data, arg)
    if kind == "truncate":
        return data[:arg]
    if kind == "append":
        return data + arg
    return resealed(data, arg)


@MUTATE
@given(checkpoint_mutations())
def test_checkpoint_reader_only_refuses(scratch, mutation):
    data = mutate_checkpoint(*mutation)
    path = scratch / "m.ckpt"
    path.write_bytes(data)
    only_refuses(lambda: ckpt.read_header(path), ckpt.CheckpointRefused, len(data))
    payload = {}

    def load():
        payload["sha"] = ckpt.load_chunks(path, TINY, lambda off, view: None).payload_sha256
    if only_refuses(load, ckpt.CheckpointRefused, len(data)):
        # what loads is the payload that was published: only the update count may differ
        assert payload["sha"] == hashlib.sha256(checkpoint_bytes()[CF.HEADER_BYTES:]).digest()
        assert data[CF.HEADER_BYTES:] == checkpoint_bytes()[CF.HEADER_BYTES:]


# ----------------------------------------------------------------------------- token cache

C0, STEPS = 1, 3
TOKENS_NEEDED = TINY.context * (C0 + STEPS) + 1


@pytest.fixture(scope="module")
def source(scratch):
    src = scratch / "source.txt"
    src.write_text("the source of the cache\n")
    return src


def token_bytes(source) -> bytes:
    ids = np.random.default_rng(7).integers(0, TINY.vocab, TOKENS_NEEDED + 100, dtype="<u4")
    return tk.header_bytes(*tk.source_fingerprint([source])) + ids.tobytes()


def token_mutations():
    size = tk.HEADER_BYTES + 4 * (TOKENS_NEEDED + 100)
    return st.one_of(
        st.tuples(st.just("flip"), flips(size)),
        st.tuples(st.just("truncate"), st.integers(0, size - 1)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
        st.tuples(st.just("header"), st.tuples(st.integers(-2 ** 63, 2 ** 63 - 1),
                                               st.integers(0, 2 ** 64 - 1))),
        st.tuples(st.just("id"), st.tuples(st.integers(0, TOKENS_NEEDED + 99),
                                           st.integers(0, 2 ** 32 - 1))))


@MUTATE
@given(token_mutations())
def test_token_cache_reader_only_refuses(scratch, source, mutation):
    kind, arg = mutation
    data = bytearray(token_bytes(source))
    if kind == "flip":
        data = bytearray(flipped(bytes(data), arg))
    elif kind == "truncate":
        data = data[:arg]
    elif kind == "append":
        data += arg
    elif kind == "header":
        data[:tk.HEADER_BYTES] = tk.header_bytes(*arg)
    else:
        index, value = arg
        struct.pack_into("<I", data, tk.HEADER_BYTES + 4 * index, value)
    path = scratch / "m.tokens"
    path.write_bytes(bytes(data))

    def read():
        cache = tk.TokenCache.open(path, TINY)
        cache.validate_run(C0, STEPS, source=str(source))
        for c in range(C0, C0 + STEPS):
            inputs, targets = cache.context(c)
            assert int(max(inputs.max(), targets.max())) < TINY.vocab   # validated means valid
    only_refuses(read, tk.TokenCacheRefused, len(data))


# ----------------------------------------------------------------------------- result file

OUTCOMES = (R.OUTCOME_COMPLETED, R.OUTCOME_DEVICE_ERROR, R.OUTCOME_INTERRUPTED,
            R.OUTCOME_HOST_ERROR)


@functools.lru_cache(None)
def result_bytes(outcome: int) -> bytes:
    import tempfile
    import os
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r")
        synthesize(TINY, outcome=outcome, seed=outcome).write(path)
        with open(path, "rb") as f:
            return f.read()


STATUS_FIELDS = ("version", "outcome", "c0", "steps_planned", "steps_completed", "update_count",
                 "gp_get", "gp_put", "publications", "backend", "compute_capability")


def result_mutations():
    return st.tuples(
        st.sampled_from(OUTCOMES),
        st.one_of(
            st.tuples(st.just("flip"), flips(50_000)),
            st.tuples(st.just("truncate"), st.integers(0, 60_000)),
            st.tuples(st.just("append"), st.binary(min_size=1, max_size=8192)),
            st.tuples(st.just("status"), st.lists(st.tuples(
                st.sampled_from(STATUS_FIELDS), st.sampled_from([0, 1, 2, 7, 8, 9, 10, 11, 65])
                | st.integers(0, 2 ** 32 - 1)), min_size=1, max_size=3)),
            st.tuples(st.just("tail"), st.lists(st.tuples(st.integers(1, 2_000),
                                                          st.integers(0, 255)),
                                                min_size=1, max_size=16))))


@MUTATE
@given(result_mutations())
def test_result_file_reader_only_refuses(scratch, mutation):
    from coppelius.forensics.summary import summarize
    outcome, (kind, arg) = mutation
    base = result_bytes(outcome)
    data = bytearray(base)
    if kind == "flip":
        data = bytearray(flipped(base, [(p % len(base), b) for p, b in arg]))
    elif kind == "truncate":
        data = data[:arg % len(base)]
    elif kind == "append":
        data += arg
    elif kind == "status":                  # rewrite fields, keep the magic: the locator's input
        prof, steps, issues, _ = RF.locate(np.frombuffer(base, np.uint8), len(base))[0]
        at = RS.section_offsets(prof, steps, issues)["status"][0]
        fields = R.STATUS_BLOCK.unpack(base[at:at + L.STATUS_BLOCK_BYTES])
        for name, value in arg:
            fields[name] = value % (1 << (8 * R.STATUS_BLOCK.dtype[name].itemsize))
        data[at:at + L.STATUS_BLOCK_BYTES] = R.STATUS_BLOCK.pack(**fields)
    else:                                   # bytes near the end: timestamps, status, notifier
        for back, value in arg:
            data[-back] = value
    path = scratch / "m.res"
    path.write_bytes(bytes(data))
    got = {}

    def read():
        got["rf"] = RF.read(path)
    if only_refuses(read, RF.ResultFileError, len(data)):
        rf = got["rf"]                      # what reads must also inspect, without a traceback
        assert rf.size == rf.expected_size == len(data)
        t0 = time.perf_counter()
        json.dumps(summarize(rf), allow_nan=False)
        rf.warnings()
        assert time.perf_counter() - t0 <= CALL_S
