"""A token cache that changes after the run checked it: every context is read again with
ordinary reads and checked, so a truncation is a `TokenCacheChanged` naming the file and the
context (never SIGBUS: nothing is mapped), ids overwritten in place are caught before they reach
staging, and a grown file, a touched mtime or a rewritten header are changes too."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.staging import tokens as tk
from coppelius.staging.views import StagingViews, allocate_host

TINY = profiles.get("tiny")
T, V = TINY.context, TINY.vocab


def _cache(tmp_path, contexts=4):
    ids = np.random.default_rng(5).integers(0, V, contexts * T + 1, dtype=np.uint32)
    path = tmp_path / "c.tokens"
    # a source's header: zeros would claim the embedded stream
    path.write_bytes(tk.header_bytes(1, 1) + ids.astype("<u4").tobytes())
    cache = tk.TokenCache.open(path, TINY)
    cache.validate_run(0, contexts)
    return path, cache, ids


def _changed(fn, *fragments):
    with pytest.raises(tk.TokenCacheChanged) as e:
        fn()
    msg = str(e.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert "\n" not in msg and e.value.hint and e.value.reason.startswith("token cache changed")
    return e.value


def _keep_mtime(path, st):
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_truncated_under_the_reader_is_a_change_naming_file_and_context(tmp_path):
    path, cache, ids = _cache(tmp_path)
    views = StagingViews(allocate_host(), TINY)
    cache.write_input_record(views, 1)
    before = views.inputs.copy()
    os.truncate(path, tk.HEADER_BYTES + 4 * (2 * T))
    err = _changed(lambda: cache.write_input_record(views, 2), str(path), "context 2",
                   f"size {16 + 4 * len(ids)} → {16 + 8 * T} bytes")
    assert err.context == 2
    np.testing.assert_array_equal(views.inputs, before)     # nothing reached staging
    # even with the size fingerprint defeated the short read is caught (no map, no SIGBUS)
    cache.fingerprint = tk._fingerprint(cache.fd)
    _changed(lambda: cache.context(2), f"it ends at token {2 * T}")


def test_ids_overwritten_in_place_with_mtime_kept_are_caught_before_staging(tmp_path):
    path, cache, ids = _cache(tmp_path)
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(tk.HEADER_BYTES + 4 * (3 * T + 5))
        f.write(b"\xff" * 4)
    _keep_mtime(path, st)
    views = StagingViews(allocate_host(), TINY)
    cache.write_input_record(views, 1)                    # context 1 does not hold that id
    _changed(lambda: cache.write_input_record(views, 3), "context 3",
             f"token {3 * T + 5} (context 3 input row 5, context 3 target row 4) now has id "
             f"4294967295, not below the vocabulary size {V}")
    np.testing.assert_array_equal(views.inputs, ids[T:2 * T])
    # the same id as the last target of context 2 (token 3T + 5 is not in it): context 2 is fine
    cache.context(2)


@pytest.mark.parametrize("change", ["grown", "mtime", "header"])
def test_grown_touched_or_new_header_is_a_change(tmp_path, change):
    path, cache, _ = _cache(tmp_path)
    st = path.stat()
    if change == "grown":
        with open(path, "ab") as f:
            f.write(b"\0" * 4)
        _keep_mtime(path, st)
        frag = "size"
    elif change == "mtime":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        frag = f"mtime {st.st_mtime_ns} → {st.st_mtime_ns + 1} ns"
    else:
        with open(path, "r+b") as f:
            f.write(tk.header_bytes(7, 9))
        _keep_mtime(path, st)
        frag = f"header {tk.header_bytes(1, 1).hex()} → "
    _changed(lambda: cache.context(0), frag, "context 0")


def test_a_change_between_open_and_the_end_of_validation_is_a_refusal(tmp_path):
    path, cache, _ = _cache(tmp_path)
    os.utime(path, ns=(0, 123))
    with pytest.raises(tk.TokenCacheRefused, match="changed while being checked"):
        cache.validate_run(0, 2)
    os.truncate(path, tk.HEADER_BYTES + 4 * T)
    cache = tk.TokenCache.open(path, TINY)
    cache.token_count = 4 * T + 1                          # as if fstat had seen the old size
    with pytest.raises(tk.TokenCacheRefused, match="shrank while being checked"):
        cache.validate_run(0, 2)


def test_a_file_truncated_to_nothing_ends_in_an_exception_not_sigbus(tmp_path):
    """In a child process, so that a SIGBUS would show as its exit status (-7), not kill pytest."""
    path, _, _ = _cache(tmp_path)
    code = ("import os, sys\n"
            "from coppelius.plan import profiles\n"
            "from coppelius.staging import tokens as tk\n"
            "c = tk.TokenCache.open(sys.argv[1], profiles.get('tiny'))\n"
            "c.validate_run(0, 4)\n"
            "os.truncate(sys.argv[1], 0)\n"
            "try:\n"
            "    c.context(3)\n"
            "except tk.TokenCacheChanged as e:\n"
            "    print(e.reason)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "token cache changed: context 3"


def test_an_io_error_reading_a_context_names_the_file(tmp_path, monkeypatch):
    path, cache, _ = _cache(tmp_path)

    def eio(*a):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(tk.os, "preadv", eio)
    with pytest.raises(OSError) as e:
        cache.context(1)
    assert e.value.errno == 5 and e.value.filename == str(path)
