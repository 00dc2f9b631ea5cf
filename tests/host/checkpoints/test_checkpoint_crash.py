"""Checkpoint crash consistency: kill -9 a publishing process at random moments, and a
write failure (RLIMIT_FSIZE) mid-publication; the path always loads as the new or the previous
checkpoint, leftover temporaries are cleaned by the next publish."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from coppelius import checkpoints as ckpt
from coppelius.checkpoints import format as CF
from coppelius.plan import profiles

from tests.support.paths import ROOT

TINY = profiles.get("tiny")
REPO = str(ROOT)
KILLS = 20
SEED = 20261129                         # the kill moments are drawn from this

# A run-like publisher: holds the lock, then publishes update counts k, k+1, … forever,
# announcing each publication before and after.
PUBLISHER = r"""
import sys, numpy as np
from coppelius import checkpoints as ckpt
from coppelius.plan import profiles
TINY = profiles.get("tiny")
N = TINY.parameter_count
path, k = sys.argv[1], int(sys.argv[2])
base = np.arange(N, dtype=np.float32)
with ckpt.lock(path):
    print("ready", flush=True)
    while True:
        print(f"begin {k}", flush=True)
        ckpt.publish(path, TINY, base * 0.5 + k, -base - k, base * 0.25 + 1000 + k, update_count=k)
        print(f"done {k}", flush=True)
        k += 1
"""


def expected_payload(k: int) -> bytes:
    base = np.arange(TINY.parameter_count, dtype=np.float32)
    return b"".join(a.tobytes() for a in (base * 0.5 + k, -base - k, base * 0.25 + 1000 + k))


def temporaries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ckpt.TEMP_MARK in n)


def check_loads_as(path, allowed: set[int]) -> int:
    """The path must verify and hold exactly the payload of one allowed update count."""
    got = bytearray(TINY.payload_bytes)

    def write_chunk(offset, view):
        got[offset:offset + view.size] = view.tobytes()

    k = ckpt.load_chunks(path, TINY, write_chunk).update_count
    assert k in allowed, f"path holds update count {k}, allowed {sorted(allowed)}"
    want = expected_payload(k)
    if bytes(got) != want:
        bad = next(i for i in range(len(want)) if got[i] != want[i])
        pytest.fail(f"payload of update count {k} differs first at byte {bad}")
    return k


def test_kill9_during_publication_leaves_new_or_previous(tmp_path):
    path = tmp_path / "run.ckpt"
    ckpt.publish(path, TINY, *np.frombuffer(expected_payload(0), np.float32).reshape(3, -1),
              update_count=0)
    rng = random.Random(SEED)
    # one publication's duration on this machine sets the scale of the kill moments
    t0 = time.perf_counter()
    ckpt.publish(tmp_path / "probe.ckpt", TINY,
              *np.frombuffer(expected_payload(0), np.float32).reshape(3, -1), update_count=0)
    span = max(time.perf_counter() - t0, 0.005)
    os.unlink(tmp_path / "probe.ckpt")

    current, left_temporaries, new_seen = 0, 0, 0
    for run in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(path), str(current + 1)],
                                 cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            # wait for the start of publication number 1..3, then kill within ~1.5 publications
            target = rng.randint(1, 3)
            begun = done = None
            while True:
                word, k = child.stdout.readline().split()
                if word == "begin":
                    begun = int(k)
                    if begun == current + target:
                        break
                else:
                    done = int(k)
            time.sleep(rng.uniform(0, 1.5 * span))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            rest = child.stdout.read().split()
            child.wait()
            child.stdout.close()
        for word, k in zip(rest[::2], rest[1::2]):
            begun, done = (int(k), done) if word == "begin" else (begun, int(k))
        previous = done if done is not None else current
        # after kill -9: the last announced publication, or the one in flight, nothing else
        current = check_loads_as(path, {previous, begun})
        new_seen += current == begun != previous
        left_temporaries += bool(temporaries(tmp_path))
        with ckpt.lock(path):              # the dead run's lock died with it
            pass
    # the next publish cleans what the killed publishers left
    ckpt.publish(path, TINY, *np.frombuffer(expected_payload(current + 1), np.float32).reshape(3, -1),
              update_count=current + 1)
    check_loads_as(path, {current + 1})
    assert temporaries(tmp_path) == []
    print(f"{KILLS} kills: {left_temporaries} left a temporary, {new_seen} landed after the "
          f"rename of the publication in flight; publish span {span * 1e3:.1f} ms")
    assert left_temporaries >= 1, "no kill landed inside a publication: the test proves nothing"


WRITER = r"""
import resource, sys, numpy as np
from coppelius import checkpoints as ckpt
from coppelius.staging.errors import UserError
from coppelius.plan import profiles
TINY = profiles.get("tiny")
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
P = np.full(TINY.parameter_count, 3.0, np.float32)
try:
    ckpt.publish(sys.argv[1], TINY, P, P, P, update_count=99)
except UserError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("limit", [CF.HEADER_BYTES + TINY.chunk_bytes + 12345,   # inside chunk 2
                                   CF.HEADER_BYTES + 100])                        # inside chunk 1
def test_write_failure_mid_publication_keeps_previous(tmp_path, limit):
    path = tmp_path / "run.ckpt"
    prev = np.frombuffer(expected_payload(7), np.float32).reshape(3, -1)
    ckpt.publish(path, TINY, *prev, update_count=7)
    before = path.read_bytes()
    # Python ignores SIGXFSZ, so writes past the limit fail with EFBIG
    r = subprocess.run([sys.executable, "-c", WRITER, str(path), str(limit)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "publication failed writing chunk" in lines[0] and "File too large" in lines[0]
    assert "previous checkpoint is intact" in lines[0] and "ulimit -f" in lines[0]
    assert path.read_bytes() == before
    check_loads_as(path, {7})
    assert temporaries(tmp_path) == []

