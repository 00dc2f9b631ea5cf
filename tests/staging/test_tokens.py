"""Token caches — open without a map, every CONTRACT §5 refusal, staging of input records."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from coppelius.staging.errors import EXIT_USER_ERROR, UserError
from coppelius.plan import profiles
from coppelius.staging import layout as L
from coppelius.staging import tokens as tk
from coppelius.staging.views import StagingViews, allocate_host

TINY = profiles.get("tiny")
T, V = TINY.context, TINY.vocab


A_SOURCE = (1, 1)      # a tokenized source's header: zeros claim the embedded stream


def write_cache(path, ids, header=A_SOURCE):
    with open(path, "wb") as f:
        f.write(tk.header_bytes(*header))
        f.write(np.asarray(ids, "<u4").tobytes())
    return path


def stream(n, seed=3):
    return np.random.default_rng(seed).integers(0, V, n, dtype=np.uint32)


def refused(fn, *fragments):
    with pytest.raises(tk.TokenCacheRefused) as e:
        fn()
    err = e.value
    assert isinstance(err, UserError) and err.exit_code == EXIT_USER_ERROR
    msg = str(err)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert "\n" not in msg and err.hint
    return msg


def test_contexts_and_input_record_into_poisoned_staging(tmp_path):
    ids = stream(3 * T + 1)
    cache = tk.TokenCache.open(write_cache(tmp_path / "a.tokens", ids), TINY)
    assert cache.context_count == 3 and cache.token_count == 3 * T + 1
    buf = allocate_host()
    views = StagingViews(buf, TINY)
    cache.write_input_record(views, 2)
    np.testing.assert_array_equal(views.inputs, ids[2 * T:3 * T])
    np.testing.assert_array_equal(views.targets, ids[2 * T + 1:3 * T + 1])
    # nothing past the input record was touched
    assert (buf[L.INPUT_RECORD_BYTES:L.SEMAPHORES] == L.POISON_BYTE).all()
    inputs, targets = cache.context(0)
    assert inputs.shape == targets.shape == (T,) and targets[-1] == ids[T]
    refused(lambda: cache.context(3), "context 3")


@pytest.mark.parametrize("size", [0, 15, 16 + 4 * T + 1, 16 + 4 * T + 3])
def test_refuses_size_not_16_plus_4k(tmp_path, size):
    path = tmp_path / "odd.tokens"
    path.write_bytes(b"\0" * size)
    refused(lambda: tk.TokenCache.open(path, TINY), str(path), f"size {size}", "16 + 4k")


def test_refuses_missing_cache(tmp_path):
    refused(lambda: tk.TokenCache.open(tmp_path / "nope", TINY), "does not exist")


def test_length_exactly_enough_and_one_short(tmp_path):
    c0, steps = 2, 3
    need = T * (c0 + steps) + 1
    ok = tk.TokenCache.open(write_cache(tmp_path / "ok", stream(need)), TINY)
    ok.validate_run(c0, steps)
    short = tk.TokenCache.open(write_cache(tmp_path / "short", stream(need - 1)), TINY)
    refused(lambda: short.validate_run(c0, steps), str(tmp_path / "short"), f"{need - 1} tokens",
            f"= {need} tokens", "contexts 2..4")


def test_id_at_or_above_v_in_very_last_token_of_last_context(tmp_path):
    c0, steps = 1, 4
    last = T * (c0 + steps)            # the target of row 1023 of context c0+steps-1
    ids = stream(last + 1 + T)        # the stream goes on past the run
    ids[last] = V
    cache = tk.TokenCache.open(write_cache(tmp_path / "c", ids), TINY)
    msg = refused(lambda: cache.validate_run(c0, steps), str(tmp_path / "c"), f"token {last} ",
                  f"context {c0 + steps - 1} target row {T - 1}", f"id {V}")
    print(msg)
    # one step fewer does not use that token; V - 1 is a legal id
    cache.validate_run(c0, steps - 1)
    ids[last] = V - 1
    tk.TokenCache.open(write_cache(tmp_path / "d", ids), TINY).validate_run(c0, steps)


def test_id_checks_only_the_contexts_the_run_uses(tmp_path):
    c0, steps = 2, 2
    ids = stream(T * 6 + 1)
    ids[T * c0 - 1] = 0xFFFFFFFF       # before the run's first context
    ids[T * (c0 + steps) + 1] = V      # after its last target
    cache = tk.TokenCache.open(write_cache(tmp_path / "c", ids), TINY)
    cache.validate_run(c0, steps)
    ids[T * c0] = V + 7                # the very first input of the first context used
    cache = tk.TokenCache.open(write_cache(tmp_path / "e", ids), TINY)
    refused(lambda: cache.validate_run(c0, steps), f"token {T * c0} ",
            f"context {c0} input row 0", f"id {V + 7}")


def test_first_bad_id_is_reported_across_scan_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(tk, "_SCAN_TOKENS", 1000)     # awkward chunk vs context sizes
    ids = stream(T * 5 + 1)
    ids[[2999, 3000, 4000]] = V + np.array([1, 2, 3], np.uint32)
    cache = tk.TokenCache.open(write_cache(tmp_path / "c", ids), TINY)
    refused(lambda: cache.validate_run(0, 5), "token 2999 ", "context 2 input row 951",
            "context 2 target row 950", f"id {V + 1}")


def test_stale_header_refused(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("def f():\n    return 1\n")
    cache_path = write_cache(tmp_path / "c", stream(2 * T + 1), tk.source_fingerprint([src]))
    tk.TokenCache.open(cache_path, TINY).validate_run(0, 2, source=str(src))
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1))          # 1 ns newer
    refused(lambda: tk.TokenCache.open(cache_path, TINY).validate_run(0, 2, source=str(src)),
            "stale", str(src), f"mtime {st.st_mtime_ns + 1} ns")
    src.write_text("def f():\n    return 2\n\n")                     # size changes too
    refused(lambda: tk.TokenCache.open(cache_path, TINY).validate_run(0, 2, source=str(src)),
            "size 23 bytes")
    # another source's header is stale as well, and a missing source is named
    other = write_cache(tmp_path / "g", stream(2 * T + 1))
    refused(lambda: tk.TokenCache.open(other, TINY).validate_run(0, 2, source=str(src)),
            "mtime 1 ns")
    refused(lambda: tk.TokenCache.open(other, TINY).validate_run(0, 2,
                                                                 source=str(tmp_path / "x")),
            "does not exist")


def test_directory_fingerprint_newest_mtime_total_size(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "__pycache__").mkdir()
    a, b = tmp_path / "d" / "a.py", tmp_path / "d" / "sub" / "b.py"
    a.write_bytes(b"x" * 10)
    b.write_bytes(b"y" * 7)
    (tmp_path / "d" / "__pycache__" / "a.pyc").write_bytes(b"z" * 100)
    (tmp_path / "d" / ".hidden").write_bytes(b"h" * 100)
    os.utime(a, ns=(1, 5_000_000_000))
    os.utime(b, ns=(1, 7_000_000_000))
    assert tk.source_files([tmp_path / "d"]) == [a, b]
    assert tk.source_fingerprint([tmp_path / "d"]) == (7_000_000_000, 17)


def test_large_cache_opens_without_reading(tmp_path):
    path = tmp_path / "big.tokens"
    n = 100_000_000                    # 400 MB, sparse: opening must not read it
    with open(path, "wb") as f:
        f.write(tk.header_bytes(*A_SOURCE))      # zeros would claim the stream: checked whole
        f.truncate(16 + 4 * n)
    t = time.perf_counter()
    cache = tk.TokenCache.open(path, profiles.get("coppelius"))
    elapsed = time.perf_counter() - t
    print(f"opened a 400 MB cache in {elapsed * 1e3:.2f} ms")
    assert not hasattr(cache, "tokens")          # nothing mapped: a truncation cannot SIGBUS
    assert cache.context_count == (n - 1) // 1024
    assert cache.context(cache.context_count - 1)[1][-1] == 0
