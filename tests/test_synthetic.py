"""Issue #3: the embedded stream — determinism across processes, structure, the exact loss floor."""
from __future__ import annotations

import hashlib
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from host.errors import UserError
from plan import profiles
from staging import synthetic as S
from staging.tokens import TokenCache

FLOOR_TOLERANCE_SIGMAS = 4.0


@pytest.fixture(scope="module")
def tiny_stream():
    p = profiles.get("tiny")
    t = time.perf_counter()
    x = S.generate(p)
    print(f"tiny stream generated in {time.perf_counter() - t:.2f} s")
    return p, x


def sha(x):
    h = hashlib.sha256(S.STREAM_HEADER)
    h.update(x.astype("<u4").tobytes())
    return h.hexdigest()


def test_floor_closed_form():
    # recompute the docstring's formula by hand for T = 1024, B = 64, J = 8, q = 1/2
    hp = 1.75 * math.log(2)
    markers = sum(math.log(2) + 0.5 * math.log(min(b, 8)) for b in range(1, 16))
    want = (markers + 63 * hp * (1 + 15 * 0.5)) / 1024
    for name in profiles.names():
        p = profiles.get(name)
        assert S.loss_floor(p) == pytest.approx(want, rel=1e-12)
        assert S.row_floor(p).mean() == pytest.approx(want, rel=1e-12)
    print(f"loss floor {want:.6f} nats/token")


def test_tiny_stream_pinned_and_structured(tiny_stream):
    p, x = tiny_stream
    assert x.dtype == np.uint32 and x.shape == (S.CONTEXTS * p.context + 1,)
    assert int(x.max()) < p.vocab
    assert sha(x) == S.STREAM_SHA256["tiny"]
    blocks = x[1:].reshape(S.CONTEXTS, -1, S.BLOCK)            # (C, nb, B)
    markers, content = blocks[:, :, 0], blocks[:, :, 1:]
    assert (markers[:, 0] == 0).all() and (markers <= S.COPY_REACH).all()
    assert (content > S.COPY_REACH).all()
    assert (markers[:, 1:] > np.minimum(np.arange(1, markers.shape[1]), S.COPY_REACH)).sum() == 0
    # every copy block equals its source exactly; copy share ≈ q
    nb = markers.shape[1]
    src = np.arange(nb)[None, :] - markers.astype(np.int64)
    gathered = np.take_along_axis(content, src[:, :, None], axis=1)
    assert (gathered == content).all()
    share = (markers[:, 1:] > 0).mean()
    assert abs(share - S.COPY_PROBABILITY) < 0.01, share


def test_oracle_log_loss_matches_floor(tiny_stream):
    """An ideal predictor that knows the source scores the floor: the floor is achievable and exact."""
    p, x = tiny_stream
    T, J, q = p.context, S.COPY_REACH, S.COPY_PROBABILITY
    table = S.successor_table(p)                                  # (V, K)
    logp = np.log(np.array(S.SUCCESSOR_PROBABILITIES))
    C = 4000
    win = np.lib.stride_tricks.sliding_window_view(x[:C * T + 1], T + 1)[::T]   # (C, T+1)
    pos = np.arange(T)                                            # row r predicts position r+1
    block, off = pos // S.BLOCK, pos % S.BLOCK
    # the walk skips markers: a block's first content token follows the token before the marker
    prev = win[:, np.where(off == 1, pos - 1, pos)].astype(np.int64)        # (C, T)
    nxt = win[:, 1:].astype(np.int64)                                       # (C, T)
    kind = win[:, 1::S.BLOCK].astype(np.int64)                    # (C, nb) block markers
    row_kind = kind[:, block]                                     # (C, T)
    nll = np.zeros((C, T))
    # markers: block 0 certain; otherwise 1-q for M0, q/min(b, J) for Mj
    m = (off == 0) & (block > 0)
    reach = np.minimum(block, J)
    nll[:, m] = np.where(row_kind[:, m] == 0, -math.log(1 - q), -np.log(q / reach[m]))
    # content in Markov blocks: the successor's probability; copy content is certain
    c = (off > 0)[None, :] & (row_kind == 0)
    hit = table[prev[c]] == nxt[c][:, None]                       # (n, K)
    assert hit.any(axis=1).all(), "a Markov token that is no successor of its predecessor"
    nll[c] = -logp[hit.argmax(axis=1)]
    per_context = nll.sum(axis=1) / T
    mean, sd = per_context.mean(), per_context.std() / math.sqrt(C)
    floor = S.loss_floor(p)
    print(f"oracle {mean:.5f} ± {sd:.5f} vs floor {floor:.5f}; "
          f"worst row deviation {np.abs(nll.mean(0) - S.row_floor(p)).max():.4f}")
    assert abs(mean - floor) < FLOOR_TOLERANCE_SIGMAS * sd, (mean, floor, sd)


def test_sha256_same_in_two_processes():
    code = ("from plan import profiles; from staging import synthetic as S; import hashlib;"
            "x = S.generate(profiles.get('coppelius')); h = hashlib.sha256(S.STREAM_HEADER);"
            "h.update(x.astype('<u4').tobytes()); print(h.hexdigest())")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)]
    assert outs[0] == outs[1] == S.STREAM_SHA256["coppelius"]


def test_ensure_default_stream_creates_verifies_and_refuses(tmp_path, tiny_stream):
    p, x = tiny_stream
    d = tmp_path / "run"
    t = time.perf_counter()
    path = S.ensure_default_stream(p, d)
    print(f"first use (generate + write) {time.perf_counter() - t:.2f} s")
    assert path == d / "tiny-stream.tokens" and path.stat().st_size == S.stream_bytes(p)
    assert path.read_bytes()[:16] == bytes(16)
    t = time.perf_counter()
    assert S.ensure_default_stream(p, d) == path
    print(f"later use (sha256 over the map) {time.perf_counter() - t:.2f} s")
    cache = TokenCache.open(path, p)
    assert cache.context_count == S.CONTEXTS
    cache.validate_run(S.CONTEXTS - p.steps, p.steps)
    np.testing.assert_array_equal(cache.tokens, x)
    # alter the very last byte: refused, naming the file
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(S.StreamAltered) as e:
        S.ensure_default_stream(p, d)
    assert isinstance(e.value, UserError) and str(path) in str(e.value) and "altered" in str(e.value)
    with open(path, "ab") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(S.StreamAltered, match="bytes, expected"):
        S.ensure_default_stream(p, d)
    path.unlink()                                      # missing: regenerated
    assert S.file_sha256(S.ensure_default_stream(p, d)) == S.STREAM_SHA256["tiny"]
