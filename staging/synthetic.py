"""The embedded default token stream (SPEC §14): a seeded synthetic source with an exact loss floor.

Design (per profile; every draw comes from raw Philox words, so the bytes never depend on numpy's
distribution algorithms):

* Ids 0..J are *markers* (J = COPY_REACH = 8); the other N = V - J - 1 ids are *content*.
* Content follows a first-order Markov chain with a fixed sparse successor distribution: a hidden
  walk y ∈ Z_N moves by one of K = 4 distinct offsets d_k with dyadic probabilities
  p = (1/2, 1/4, 1/8, 1/8), and the token is J + 1 + π[y] for a fixed random permutation π.  So a
  content token t has exactly four successors, π-images of π⁻¹(t - J - 1) + d_k, and since the
  increments are i.i.d. the past tells nothing beyond the current token: H(p) = 1.75 ln 2 nats.
* Each context (stream ids 1024c .. 1024c+1024, SPEC §5) predicts 1024 tokens laid out as
  T/B blocks of B = 64: one marker then B-1 content tokens.  Block 0's marker is M0 (a Markov
  block).  Block b ≥ 1 is, independently, a Markov block (marker M0) with probability 1 - q, or,
  with probability q = 1/2, a *copy block*: marker Mj with j uniform in 1..min(b, J), and its
  content repeats block b - j's content exactly (a copy span 64·j positions back, inside the same
  context: it rewards attention).  A Markov block's walk continues from the token before its marker.
* Nothing crosses a context boundary except the shared token 1024c, so a model that sees the
  context's prefix has all the information the full past has, and the loss floor is exact:

      H_ctx = Σ_{b=1}^{T/B-1} [ h(q) + q·ln min(b, J) ] + (B-1)·H(p)·(1 + (T/B-1)(1-q))
      floor = H_ctx / T   nats/token,      h(q) = -q ln q - (1-q) ln(1-q)

  (markers of block 0 are certain; copy content is certain).  For T = 1024 this is
  0.65677... nats/token for every profile (the vocabulary size does not enter).  `row_floor` gives
  the per-row conditional entropy whose mean is the floor.

The copy distance uses `word % m` on a 64-bit word: its bias (< 2⁻⁶¹) is below float precision.
Generation is vectorized over chunks of contexts with a loop over the T/B blocks only.
"""
from __future__ import annotations

import hashlib
import math
import mmap
import os
import pathlib
import tempfile

import numpy as np

from .errors import UserError

CONTEXTS = 20_000                      # SPEC §14: enough for two consecutive runs
BLOCK = 64                             # B: tokens per block, marker included
COPY_REACH = 8                         # J: a copy block repeats one of the previous J blocks
COPY_PROBABILITY = 0.5                 # q: one raw bit
SUCCESSOR_PROBABILITIES = (0.5, 0.25, 0.125, 0.125)   # p: decoded from 3 raw bits below
_SUCCESSOR_OF_3_BITS = np.array([0, 0, 0, 0, 1, 1, 2, 3], np.int64)
STREAM_HEADER = bytes(16)              # SPEC §5: mtime 0 and size 0 mark a generated stream
STREAM_SUFFIX = "-stream.tokens"
DEFAULT_DIRECTORY = "coppelius-run"    # where `coppelius run` with no arguments keeps its files
_CHUNK_CONTEXTS = 1000                 # bounds peak memory (~50 MB of int64 per chunk)
_KEY_DOMAIN = 0x5354524541          # "STREA": separates this key from the initialization's

# sha256 of `<profile>-stream.tokens` (header included), pinned by tests/test_synthetic.py
STREAM_SHA256 = {
    "coppelius": "c2203351737121ade88d81609a7c3e1673a450c026e8a09a22ff46160da67423",
    "tiny": "7bebc4e4ea8be931b6ecd1199ba69d3316b954b4e0edb7a0499ee84e37547012",
}


class StreamAltered(UserError):
    """The cached default stream on disk is not the one the seed generates."""


def _key(profile) -> int:
    tag = int.from_bytes(profile.name.encode("ascii")[:8].ljust(8, b"\0"), "little")
    return profile.seed | ((tag ^ _KEY_DOMAIN) << 64)


def _shape(profile) -> tuple[int, int]:
    """(content ids N, blocks per context); refuses a profile the design does not fit."""
    T, V = profile.context, profile.vocab
    if T % BLOCK:
        raise ValueError(f"profile {profile.name}: context {T} is not a multiple of {BLOCK}")
    n = V - COPY_REACH - 1
    if n < 2 * len(SUCCESSOR_PROBABILITIES):
        raise ValueError(f"profile {profile.name}: vocabulary {V} too small for the stream")
    return n, T // BLOCK


def _walk(bits, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed chain: permutation π (N,) and K distinct nonzero offsets mod N (K,)."""
    perm = np.argsort(bits.random_raw(n), kind="stable").astype(np.int64)
    offsets: list[int] = []
    while len(offsets) < len(SUCCESSOR_PROBABILITIES):
        d = 1 + int(bits.random_raw()) % (n - 1)
        if d not in offsets:
            offsets.append(d)
    return perm, np.array(offsets, np.int64)


def successor_table(profile) -> np.ndarray:
    """(V, K) int64: content token t's successors, most likely first; -1 rows for markers."""
    n, _ = _shape(profile)
    perm, d_k = _walk(np.random.Philox(key=_key(profile)), n)
    inverse = np.empty(n, np.int64)
    inverse[perm] = np.arange(n)
    table = np.full((profile.vocab, len(d_k)), -1, np.int64)
    table[COPY_REACH + 1:] = COPY_REACH + 1 + perm[(inverse[:, None] + d_k) % n]
    return table


def generate(profile) -> np.ndarray:
    """The stream's CONTEXTS·T + 1 token ids (uint32), a pure function of the profile and seed."""
    N, nb = _shape(profile)
    T, J, B1 = profile.context, COPY_REACH, BLOCK - 1
    bits = np.random.Philox(key=_key(profile))
    perm, d_k = _walk(bits, N)
    y_start = int(bits.random_raw()) % N                   # the walk before context 0
    block_words = bits.random_raw(CONTEXTS * (nb - 1)).reshape(CONTEXTS, nb - 1)

    # block kinds: 0 Markov, j ≥ 1 copy of the block j back (never past the context start)
    reach = np.minimum(np.arange(1, nb, dtype=np.uint64), J)                # (nb-1,)
    copy = (block_words & np.uint64(1)).astype(bool)
    dist = ((block_words >> np.uint64(1)) % reach + np.uint64(1)).astype(np.int64)
    kinds = np.zeros((CONTEXTS, nb), np.int64)                              # (C, nb)
    kinds[:, 1:] = np.where(copy, dist, 0)

    out = np.empty(CONTEXTS * T + 1, np.uint32)
    out[0] = J + 1 + perm[y_start]
    y0 = y_start                                   # absolute walk value of token 1024c
    words_per_context = nb * B1 // 8               # 1008 increment bytes = 126 words: chunks align
    for a in range(0, CONTEXTS, _CHUNK_CONTEXTS):
        c = min(_CHUNK_CONTEXTS, CONTEXTS - a)
        raw = bits.random_raw(c * words_per_context).astype("<u8").view(np.uint8)
        steps = d_k[_SUCCESSOR_OF_3_BITS[raw & 7]].reshape(c, nb, B1)      # (c, nb, B-1)
        y = np.zeros((c, nb, B1), np.int64)        # walk relative to token 1024c
        start = np.zeros(c, np.int64)
        rows = np.arange(c)
        kind = kinds[a:a + c]
        for b in range(nb):
            walk = start[:, None] + np.cumsum(steps[:, b], axis=1)         # (c, B-1)
            if b:
                src = y[rows, b - np.maximum(kind[:, b], 1)]              # (c, B-1)
                walk = np.where(kind[:, b, None] > 0, src, walk)
            y[:, b] = walk
            start = walk[:, -1]
        # absolute walk of each context's token 0: cumulative over the chunk's contexts
        base = y0 + np.concatenate(([0], np.cumsum(start[:-1])))           # (c,)
        y0 = int((y0 + start.sum()) % N)
        tokens = np.empty((c, nb, BLOCK), np.uint32)
        tokens[:, :, 0] = kind
        tokens[:, :, 1:] = J + 1 + perm[(y + (base % N)[:, None, None]) % N]
        out[1 + a * T:1 + (a + c) * T] = tokens.reshape(-1)
    return out


def row_floor(profile) -> np.ndarray:
    """(T,) float64: the conditional entropy (nats) of the token row r predicts, given the context."""
    _, nb = _shape(profile)
    q, J = COPY_PROBABILITY, COPY_REACH
    hp = -sum(p * math.log(p) for p in SUCCESSOR_PROBABILITIES)
    hq = -q * math.log(q) - (1 - q) * math.log(1 - q)
    pos = np.arange(profile.context)              # row r predicts position r + 1 of the context
    block, offset = pos // BLOCK, pos % BLOCK
    marker = np.where(block == 0, 0.0, hq + q * np.log(np.minimum(np.maximum(block, 1), J)))
    content = np.where(block == 0, hp, (1 - q) * hp)
    return np.where(offset == 0, marker, content)


def loss_floor(profile) -> float:
    """The stream's exact entropy rate in nats/token (the closed form in the module docstring)."""
    _, nb = _shape(profile)
    q, J = COPY_PROBABILITY, COPY_REACH
    hp = -sum(p * math.log(p) for p in SUCCESSOR_PROBABILITIES)
    hq = -q * math.log(q) - (1 - q) * math.log(1 - q)
    h_ctx = (sum(hq + q * math.log(min(b, J)) for b in range(1, nb))
             + (BLOCK - 1) * hp * (1 + (nb - 1) * (1 - q)))
    return h_ctx / profile.context


def stream_bytes(profile) -> int:
    return len(STREAM_HEADER) + 4 * (CONTEXTS * profile.context + 1)


def file_sha256(path) -> str:
    """sha256 of a file, hashed over a memory map (no copy through Python buffers)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256()
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
        return h.hexdigest()


def expected_sha256(profile) -> str:
    pinned = STREAM_SHA256.get(profile.name)
    if pinned:
        return pinned
    h = hashlib.sha256(STREAM_HEADER)
    h.update(generate(profile).astype("<u4").tobytes())
    return h.hexdigest()


def ensure_default_stream(profile, directory=DEFAULT_DIRECTORY) -> pathlib.Path:
    """`<directory>/<profile>-stream.tokens`: generated on first use, verified on every later one."""
    directory = pathlib.Path(directory)
    path = directory / f"{profile.name}{STREAM_SUFFIX}"
    if path.exists():
        size = path.stat().st_size
        want = stream_bytes(profile)
        if size != want:
            raise StreamAltered(f"embedded stream {path} has {size} bytes, expected {want}",
                                f"delete {path}; the next run regenerates it")
        got, exp = file_sha256(path), expected_sha256(profile)
        if got != exp:
            raise StreamAltered(f"embedded stream {path} was altered: sha256 {got[:16]}…, "
                                f"expected {exp[:16]}…",
                                f"delete {path}; the next run regenerates it")
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tokens = generate(profile).astype("<u4", copy=False)
    digest = hashlib.sha256(STREAM_HEADER)
    digest.update(memoryview(tokens).cast("B"))
    if profile.name in STREAM_SHA256 and digest.hexdigest() != STREAM_SHA256[profile.name]:
        # a program fault (e.g. a changed bit generator), not a user error: never write it
        raise RuntimeError(f"the {profile.name} stream generator no longer reproduces its pinned "
                           f"sha256 ({digest.hexdigest()[:16]}… ≠ {STREAM_SHA256[profile.name][:16]}…)")
    fd, tmp = tempfile.mkstemp(prefix=f".{profile.name}-stream.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(STREAM_HEADER)
            f.write(memoryview(tokens).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)          # concurrent first uses race harmlessly: same bytes
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
