"""The embedded stream — determinism, structure, the exact floor per context."""
from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from coppelius.staging.errors import UserError
from coppelius.plan import profiles
from coppelius.staging import synthetic as S
from coppelius.staging.tokens import TokenCache
from tests.support.paths import ROOT

FLOOR_TOLERANCE_SIGMAS = 4.0
GENERATION_BUDGET_S = 10.0         # the stream is generated in at most 10 s
EXACT = 1e-12                      # per-context floor vs a perfect model: float rounding only
AWKWARD = S.Design(block=32, copy_reach=3, successors=2, content_max=97)


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


def perfect_model_nll(p, x, contexts, design=S.DESIGN) -> np.ndarray:
    """(C, T): −log p_true of each target under the source itself, from the generator's own tables
    (successor table, marker ranges, copy sources), independently of the floor's formula."""
    T, B, J, K = p.context, design.block, design.copy_reach, design.successors
    table = S.successor_table(p, design)                                    # (V, K)
    win = np.stack([x[T * c:T * c + T + 1] for c in contexts]).astype(np.int64)   # (C, T+1)
    r = np.arange(T)                                # row r predicts window position r + 1
    block, off = r // B, r % B
    kind = win[:, 1::B]                                                     # (C, nb) markers
    target, row_kind = win[:, 1:], kind[:, block]                          # (C, T)
    prob = np.zeros(win[:, 1:].shape)
    # markers: block 0 certain 0; block b uniform over 0..min(b, J)
    m = np.minimum(block, J)
    prob[:, off == 0] = np.where(target[:, off == 0] <= m[off == 0], 1.0 / (m[off == 0] + 1), 0.0)
    # Markov content: uniform over the K successors of the previous content token (the walk skips
    # the marker: a block's first content token follows the token before its marker)
    prev = win[:, np.where(off == 1, r - 1, r)]                             # (C, T)
    markov = (off > 0)[None, :] & (row_kind == 0)
    hit = (table[prev[markov]] == target[markov][:, None]).any(axis=1)
    prob[markov] = np.where(hit, 1.0 / K, 0.0)
    # copy content: certain, the token B·j positions back
    copy = (off > 0)[None, :] & (row_kind > 0)
    src = np.broadcast_to(r + 1, target.shape)[copy] - B * row_kind[copy]
    prob[copy] = (win[np.nonzero(copy)[0], src] == target[copy]).astype(float)
    with np.errstate(divide="ignore"):
        return -np.log(prob)


def no_copy_model_nll(p, x, contexts, design=S.DESIGN) -> np.ndarray:
    """(C, T): −log p_true under the predictor that knows the markers and the chain but never
    copies: a copy block's first content token is a fresh draw (uniform over the N content ids),
    each later one a successor of the token before it (a copied run is a run of the chain)."""
    T, B, K = p.context, design.block, design.successors
    N, J = S.content_size(p, design), design.copy_reach
    table = S.successor_table(p, design)                                    # (V, K)
    win = np.stack([x[T * c:T * c + T + 1] for c in contexts]).astype(np.int64)   # (C, T+1)
    nll = perfect_model_nll(p, x, contexts, design)
    r = np.arange(T)
    off, row_kind, target = r % B, win[:, 1::B][:, r // B], win[:, 1:]
    first = (off == 1)[None, :] & (row_kind > 0)
    ok = (target[first] > J) & (target[first] <= J + N)
    nll[first] = np.where(ok, math.log(N), np.inf)
    later = (off > 1)[None, :] & (row_kind > 0)
    hit = (table[win[:, :-1][later]] == target[later][:, None]).any(axis=1)
    nll[later] = np.where(hit, math.log(K), np.inf)
    return nll


def test_floor_closed_form():
    # the module docstring's formulas by hand for T = 1024, B = 64, J = 2, K = 4
    markers = math.log(2) + 14 * math.log(3)                   # block 1: 2 options, blocks 2..15: 3
    markov = 1 + 1 / 2 + 14 / 3                                # expected Markov blocks per context
    want = (markers + 63 * math.log(4) * markov) / 1024
    for name in profiles.names():
        p = profiles.get(name)
        n = min(p.vocab - 3, 1024)
        no_copy = want + (16 - markov) * (math.log(n) + 62 * math.log(4)) / 1024
        assert S.content_size(p) == n
        assert S.loss_floor(p) == pytest.approx(want, rel=1e-12)
        assert S.no_copy_level(p) == pytest.approx(no_copy, rel=1e-12)
        print(f"{name}: floor {want:.6f}, no-copy level {no_copy:.6f} nats/token (N = {n})")


@pytest.mark.parametrize("design", [S.DESIGN, AWKWARD], ids=["shipped", "awkward"])
def test_context_floor_equals_perfect_model(design):
    """Every choice is uniform, so a perfect model's −log p_true is each target's conditional
    entropy exactly: per context, per row, and a floor off by one marker is caught."""
    p = profiles.get("tiny")
    x = S.generate(p, design)
    contexts = np.arange(200)
    nll = perfect_model_nll(p, x, contexts, design)                        # (C, T)
    assert np.isfinite(nll).all(), "a target the source cannot have produced"
    floor = S.context_floor(p, contexts, x, design)
    print("context  floor       perfect-model mean -log p_true")
    for c in range(10):
        print(f"{c:7d}  {floor[c]:.12f}  {nll[c].mean():.12f}")
    np.testing.assert_allclose(floor, nll.mean(axis=1), rtol=0, atol=EXACT)
    np.testing.assert_allclose(S.row_entropy(p, contexts, x, design), nll, rtol=0, atol=EXACT)
    # the no-copy level is above the floor by the copy blocks' cost exactly
    copies = (S.context_markers(p, contexts, x, design) > 0).sum(axis=1)
    N, B, lnk = S.content_size(p, design), design.block, math.log(design.successors)
    np.testing.assert_allclose(S.context_no_copy(p, contexts, x, design) - floor,
                               copies * (math.log(N) + (B - 2) * lnk) / p.context, atol=EXACT)
    # ... and equals the mean −log p_true of the non-copying predictor, computed from the tables
    no_copy = no_copy_model_nll(p, x, contexts, design)
    assert np.isfinite(no_copy).all(), "a copied run that is not a run of the chain"
    np.testing.assert_allclose(S.context_no_copy(p, contexts, x, design), no_copy.mean(axis=1),
                               rtol=0, atol=EXACT)
    # a floor computed from one wrong marker (a Markov block read as a copy) misses by exactly
    # one Markov block's content, (B-1)·ln K / T, far above the tolerance: the check can fail
    c = 3
    markers = S.context_markers(p, c, x, design)[0]
    b = int(np.flatnonzero(markers[1:] == 0)[0]) + 1
    wrong = x.copy()
    wrong[1 + p.context * c + B * b] = 1
    miss = nll[c].mean() - S.context_floor(p, c, wrong, design)[0]
    assert miss == pytest.approx((B - 1) * lnk / p.context, abs=EXACT) and miss > 1e6 * EXACT
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(S.context_floor(p, contexts, wrong, design), nll.mean(axis=1),
                                   rtol=0, atol=EXACT)


def test_floor_against_empirical_estimate(tiny_stream):
    """The closed forms against plug-in estimates from the ids alone (no generator tables)."""
    p, x = tiny_stream
    T, B, J, K = p.context, S.BLOCK, S.COPY_REACH, S.DESIGN.successors
    contexts = np.arange(S.CONTEXTS)
    floor = S.context_floor(p, contexts, x)
    sd = floor.std() / math.sqrt(len(floor))
    print(f"mean per-context floor {floor.mean():.5f} ± {sd:.5f} (sd {floor.std():.3f}, "
          f"{floor.min():.3f}..{floor.max():.3f}) vs closed form {S.loss_floor(p):.5f}")
    assert abs(floor.mean() - S.loss_floor(p)) < FLOOR_TOLERANCE_SIGMAS * sd
    no_copy = S.context_no_copy(p, contexts, x)
    assert abs(no_copy.mean() - S.no_copy_level(p)) < FLOOR_TOLERANCE_SIGMAS * no_copy.std() / math.sqrt(len(floor))
    # marker frequencies: uniform over 0..min(b, J) in every block
    markers = x[1:].reshape(S.CONTEXTS, -1, B)[:, :, 0].astype(np.int64)   # (C, nb)
    for b in range(1, markers.shape[1]):
        m = min(b, J)
        share = np.bincount(markers[:, b], minlength=m + 1) / S.CONTEXTS
        assert len(share) == m + 1 and np.abs(share - 1 / (m + 1)).max() < 0.015, (b, share)
    # the chain, estimated from Markov-block transitions: K successors each, ≈ uniform, ln K nats
    win = x[1:].reshape(S.CONTEXTS, -1, B).astype(np.int64)
    markov = markers == 0
    pairs = np.stack([win[:, :, 1:-1][markov].reshape(-1), win[:, :, 2:][markov].reshape(-1)], 1)
    counts = np.unique(pairs, axis=0, return_counts=True)
    succ = np.bincount(counts[0][:, 0])
    seen = succ[succ > 0]
    assert (seen == K).all(), np.unique(seen)
    n = counts[1]
    by_token = np.bincount(counts[0][:, 0], weights=n)
    pr = n / by_token[counts[0][:, 0]]
    h_est = float(-(n * np.log(pr)).sum() / n.sum())
    print(f"plug-in chain entropy {h_est:.4f} vs ln K {math.log(K):.4f}")
    assert abs(h_est - math.log(K)) < 0.01


def test_tiny_stream_pinned_and_structured(tiny_stream):
    p, x = tiny_stream
    J, N = S.COPY_REACH, S.content_size(p)
    assert x.dtype == np.uint32 and x.shape == (S.CONTEXTS * p.context + 1,)
    assert int(x.max()) < J + 1 + N <= p.vocab
    assert sha(x) == S.STREAM_SHA256["tiny"]
    blocks = x[1:].reshape(S.CONTEXTS, -1, S.BLOCK)            # (C, nb, B)
    markers, content = blocks[:, :, 0], blocks[:, :, 1:]
    assert (markers[:, 0] == 0).all() and (markers <= J).all()
    assert (content > J).all()
    assert (markers > np.minimum(np.arange(markers.shape[1]), J)).sum() == 0
    # every copy block equals its source exactly
    nb = markers.shape[1]
    src = np.arange(nb)[None, :] - markers.astype(np.int64)
    gathered = np.take_along_axis(content, src[:, :, None], axis=1)
    assert (gathered == content).all()
    rows = S.copy_rows(p, np.arange(5), x)
    assert rows.shape == (5, p.context) and (rows.reshape(5, nb, -1)[:, :, 0] == 0).all()


def test_seed_markers_are_the_stream_markers(tiny_stream):
    """The host reads floors from the seed without the stream: the same draws as the generator."""
    p, x = tiny_stream
    t = time.perf_counter()
    S.block_markers.cache_clear()
    seed = S.block_markers(p)
    print(f"markers of all {S.CONTEXTS} contexts from the seed in {1e3 * (time.perf_counter() - t):.1f} ms")
    everything = np.arange(S.CONTEXTS)
    np.testing.assert_array_equal(seed, S.context_markers(p, everything, x))
    np.testing.assert_array_equal(S.context_floor(p, everything), S.context_floor(p, everything, x))
    assert not seed.flags.writeable
    other = S.block_markers(p, AWKWARD)
    assert other.shape == (S.CONTEXTS, p.context // AWKWARD.block) and other.max() == AWKWARD.copy_reach


def test_context_markers_refuse_other_ids(tiny_stream):
    p, x = tiny_stream
    bad = x.copy()
    bad[1 + p.context * 7 + S.BLOCK * 5] = S.COPY_REACH + 1           # a content id in a marker slot
    S.context_floor(p, np.arange(7), bad)                              # earlier contexts are fine
    with pytest.raises(S.StreamAltered, match="context 7 block 5") as e:
        S.context_floor(p, np.arange(10), bad)
    assert isinstance(e.value, UserError) and e.value.hint
    with pytest.raises(ValueError, match="outside the embedded stream"):
        S.context_floor(p, [S.CONTEXTS])
    with pytest.raises(ValueError, match="outside a stream of 5000 ids"):
        S.context_floor(p, [4], x[:5000])


@pytest.fixture(scope="module")
def coppelius_stream():
    p = profiles.get("coppelius")
    wall, cpu = time.perf_counter(), time.process_time()
    x = S.generate(p)
    return p, x, time.perf_counter() - wall, time.process_time() - cpu


def test_coppelius_stream_fast_pinned_and_exact(coppelius_stream):
    """Generation ≤ 10 s on the 2-core machine; ids < V; the pinned bytes; the floor of
    the first contexts equal to a perfect model's mean −log p_true (docs/STREAM.md's table)."""
    p, x, wall, cpu = coppelius_stream
    print(f"coppelius stream generated in {wall:.2f} s wall, {cpu:.2f} s CPU")
    assert cpu <= GENERATION_BUDGET_S, cpu           # CPU time: the wall depends on the load
    assert x.shape == (S.CONTEXTS * p.context + 1,) and x.dtype == np.uint32
    assert int(x.max()) < S.COPY_REACH + 1 + S.content_size(p) <= p.vocab
    assert sha(x) == S.STREAM_SHA256["coppelius"]
    contexts = np.arange(10)
    nll, no_copy = perfect_model_nll(p, x, contexts), no_copy_model_nll(p, x, contexts)
    floor, level = S.context_floor(p, contexts), S.context_no_copy(p, contexts)
    markers = S.context_markers(p, contexts)
    print("| context | markers, blocks 0..15 | copy blocks | floor | perfect model "
          "| difference | no-copy level | non-copying model |")
    for c in contexts:
        print(f"| {c} | {''.join(map(str, markers[c]))} | {(markers[c] > 0).sum()} "
              f"| {floor[c]:.15f} | {nll[c].mean():.15f} | {floor[c] - nll[c].mean():.1e} "
              f"| {level[c]:.12f} | {no_copy[c].mean():.12f} |")
    np.testing.assert_allclose(floor, nll.mean(axis=1), rtol=0, atol=EXACT)
    np.testing.assert_allclose(level, no_copy.mean(axis=1), rtol=0, atol=EXACT)


def test_sha256_same_in_two_processes():
    code = ("from coppelius.plan import profiles; from coppelius.staging import synthetic as S; import hashlib;"
            "p = profiles.get('coppelius'); x = S.generate(p); assert int(x.max()) < p.vocab;"
            "h = hashlib.sha256(S.STREAM_HEADER); h.update(x.astype('<u4').tobytes()); print(h.hexdigest())")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)]
    assert outs[0] == outs[1] == S.STREAM_SHA256["coppelius"]


def test_ensure_default_stream_creates_verifies_and_refuses(tmp_path, tiny_stream, monkeypatch):
    p, x = tiny_stream
    d = tmp_path / "run"
    synced = []
    real_fsync_directory = S.paths.fsync_directory

    def fsync_directory(directory, strict=False):
        # the rename is made durable: the directory is synced once the file has its name
        synced.append((Path(directory), (d / "tiny-stream.tokens").exists()))
        real_fsync_directory(directory, strict)

    monkeypatch.setattr(S.paths, "fsync_directory", fsync_directory)
    t = time.perf_counter()
    path = S.ensure_default_stream(p, d)
    print(f"first use (generate + write) {time.perf_counter() - t:.2f} s")
    assert path == d / "tiny-stream.tokens" and path.stat().st_size == S.stream_bytes(p)
    assert synced == [(d, True)], synced
    assert path.read_bytes()[:16] == bytes(16)
    t = time.perf_counter()
    assert S.ensure_default_stream(p, d) == path
    print(f"later use (sha256 over the map) {time.perf_counter() - t:.2f} s")
    cache = TokenCache.open(path, p)
    assert cache.context_count == S.CONTEXTS
    cache.validate_run(S.CONTEXTS - p.steps, p.steps)
    np.testing.assert_array_equal(cache.ids(), x)
    # the per-context floor reads the markers straight from the memory map
    np.testing.assert_array_equal(S.context_floor(p, range(100), cache.ids()),
                                  S.context_floor(p, range(100), x))
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


def test_design_refuses_what_does_not_fit():
    p = profiles.get("tiny")
    with pytest.raises(ValueError, match="power of two"):
        S.generate(p, replace(S.DESIGN, successors=3))
    with pytest.raises(ValueError, match="multiple of block"):
        S.generate(p, replace(S.DESIGN, block=48))
    with pytest.raises(ValueError, match="too small"):
        S.generate(replace(p, vocab=10))


def test_proxy_tool_old_stream_is_the_old_bytes():
    from tools import proxy_train
    p = profiles.get("tiny")
    old = proxy_train.OldStream(p)
    assert sha(old.generate()) == old.SHA256["tiny"]


def test_proxy_tool_smoke(tmp_path):
    """A few steps of a tiny proxy: the printed floor is the stream's per-context floor."""
    out = tmp_path / "curve.jsonl"
    r = subprocess.run([sys.executable, "-m", "tools.proxy_train", "--profile", "tiny",
                        "--width", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
                        "--head-dim", "16", "--steps", "4", "--every", "2", "--threads", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["step"] for row in rows] == [2, 4]
    p = profiles.get("tiny")
    x = S.generate(p)
    assert rows[1]["floor"] == pytest.approx(S.context_floor(p, [2, 3]).mean(), rel=1e-12)
    assert rows[1]["no_copy"] == pytest.approx(S.context_no_copy(p, [2, 3]).mean(), rel=1e-12)
    assert all(abs(row["loss"] - math.log(p.vocab)) < 0.2 for row in rows)   # untrained: ≈ ln V
