"""Checkpoint envelope: round trips, every CONTRACT §10 refusal by name, the lock,
open_input's fresh/continuation decision, and a hypothesis fuzz of the header reader."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coppelius import checkpoints as ckpt
from coppelius.checkpoints import format as CF
from coppelius.plan import profiles
from coppelius.staging import layout, views

TINY = profiles.get("tiny")
COPPELIUS = profiles.get("coppelius")
N = TINY.parameter_count


def planes(k: int):
    """Deterministic planes for update count k: every element differs between P, M and V."""
    base = np.arange(N, dtype=np.float32)
    return base * 0.5 + k, -base - k, base * 0.25 + 1000 + k      # (N,) each


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    return "identical" if bad.size == 0 else \
        f"{bad.size} differ, first at {bad[0]}: {a[bad[0]]!r} vs {b[bad[0]]!r}"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """One valid tiny checkpoint (update count 5) and its bytes."""
    path = tmp_path_factory.mktemp("ckpt") / "good.ckpt"
    ckpt.publish(path, TINY, *planes(5), update_count=5)
    return path, path.read_bytes()


def write(tmp_path, data: bytes, name="c.ckpt"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def with_header(data: bytes, header: CF.Header) -> bytes:
    return header.encode() + data[CF.HEADER_BYTES:]


def refused(path, profile=TINY) -> str:
    """Load `path`; return the refusal's text, checking no chunk was handed on for header-level
    refusals (the caller checks chunk ones)."""
    handed = []
    with pytest.raises(ckpt.CheckpointRefused) as e:
        ckpt.load_chunks(path, profile, lambda off, view: handed.append(off))
    msg = str(e.value)
    assert "\n" not in msg and e.value.hint, msg
    return msg, handed


# ------------------------------------------------------------------------------ round trips

def test_round_trip_bytes_sizes_and_digests(tmp_path):
    P, M, V = planes(3)
    pub = ckpt.publish(tmp_path / "a.ckpt", TINY, P, M, V, update_count=3)
    data = (tmp_path / "a.ckpt").read_bytes()
    assert len(data) == pub.bytes == CF.HEADER_BYTES + TINY.payload_bytes == 6_016_000
    assert pub.sha256 == hashlib.sha256(data).digest()
    payload = data[CF.HEADER_BYTES:]
    assert payload == P.tobytes() + M.tobytes() + V.tobytes()    # fp32 LE, P then M then V
    h = CF.Header.decode(data)
    assert h.update_count == 3 and h.chunk_count == TINY.chunk_count == 2
    for i, d in enumerate(h.digests):
        start, n = h.chunk_span(i)
        assert d == hashlib.sha256(payload[start:start + n]).digest(), f"chunk {i}"
    assert h.header_digest == hashlib.sha256(data[:CF.HEADER_DIGEST]).digest()
    assert data[:8] == b"CPLSCKPT" and struct.unpack_from("<IIQ", data, 8) == (1, 16384, 3)
    u, P2, M2, V2 = ckpt.load(tmp_path / "a.ckpt", TINY)
    assert u == 3
    for name, a, b in (("P", P, P2), ("M", M, M2), ("V", V, V2)):
        assert first_difference(a, b) == "identical", name


def test_publish_twice_is_byte_identical_and_leaves_no_temporary(tmp_path):
    ckpt.publish(tmp_path / "a.ckpt", TINY, *planes(1), update_count=1)
    ckpt.publish(tmp_path / "b.ckpt", TINY, *planes(1), update_count=1)
    assert (tmp_path / "a.ckpt").read_bytes() == (tmp_path / "b.ckpt").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt"]


def test_poisoned_transfer_window_round_trip(tmp_path):
    """Chunks pass through a poisoned staging window; the window's poison never reaches the file
    and load hands chunks over as views of that window."""
    staging = views.allocate_host()
    window = staging[layout.TRANSFER_WINDOW:layout.TRANSFER_WINDOW + layout.TRANSFER_WINDOW_BYTES]
    P, M, V = planes(9)
    ckpt.publish(tmp_path / "a.ckpt", TINY, P, M, V, update_count=9, transfer=window)
    expect = P.tobytes() + M.tobytes() + V.tobytes()
    assert (tmp_path / "a.ckpt").read_bytes()[CF.HEADER_BYTES:] == expect
    views.poison(window)
    got = bytearray(TINY.payload_bytes)
    seen = []

    def write_chunk(offset, view):
        assert np.shares_memory(view, window)
        seen.append((offset, view.size))
        got[offset:offset + view.size] = view.tobytes()

    loaded = ckpt.load_chunks(tmp_path / "a.ckpt", TINY, write_chunk, transfer=window)
    assert seen == [(0, 4194304), (4194304, TINY.payload_bytes - 4194304)]
    assert bytes(got) == expect
    assert loaded.payload_sha256 == hashlib.sha256(expect).digest()
    assert loaded.update_count == 9
    assert loaded.stat.st_ino == os.stat(tmp_path / "a.ckpt").st_ino


def test_publish_chunks_reads_each_span_once_in_order(tmp_path):
    P, M, V = planes(2)
    payload = np.frombuffer(P.tobytes() + M.tobytes() + V.tobytes(), np.uint8)
    calls = []

    def read_chunk(offset, nbytes, out):
        calls.append((offset, nbytes, out.size))
        out[:] = payload[offset:offset + nbytes]

    pub = ckpt.publish_chunks(tmp_path / "a.ckpt", TINY, 2, read_chunk)
    assert calls == [(0, 4194304, 4194304), (4194304, 1805312, 1805312)]
    assert ckpt.load(tmp_path / "a.ckpt", TINY)[0] == 2 and pub.update_count == 2


def test_publish_keeps_previous_mode_and_replaces_inode(tmp_path):
    p = tmp_path / "a.ckpt"
    p.write_bytes(b"")
    os.chmod(p, 0o640)
    before = os.stat(p).st_ino
    ckpt.publish(p, TINY, *planes(0), update_count=0)
    assert os.stat(p).st_mode & 0o777 == 0o640 and os.stat(p).st_ino != before


# --------------------------------------------------------------------- refusals (CONTRACT §10)

def test_refuses_wrong_magic(tmp_path, good):
    msg, handed = refused(write(tmp_path, b"CPLSCKPX" + good[1][8:]))
    assert "magic differs" in msg and "CPLSCKPX" in msg and not handed


def test_refuses_wrong_version(tmp_path, good):
    h = CF.Header.decode(good[1])
    msg, handed = refused(write(tmp_path, with_header(good[1], dataclasses.replace(h, version=2))))
    assert "envelope version differs: file 2 expected 1" in msg and not handed


def test_refuses_header_digest(tmp_path, good):
    data = bytearray(good[1])
    data[16] ^= 0x01                     # update count changed without resealing
    msg, handed = refused(write(tmp_path, bytes(data)))
    assert "header digest differs" in msg and not handed
    data = bytearray(good[1])
    data[CF.HEADER_DIGEST + 31] ^= 0x80   # the digest's last bit
    assert "header digest differs" in refused(write(tmp_path, bytes(data), "d.ckpt"))[0]


@pytest.mark.parametrize("size", [1, 8, CF.HEADER_BYTES - 1])
def test_refuses_file_shorter_than_header(tmp_path, good, size):
    msg, _ = refused(write(tmp_path, good[1][:size]))
    assert f"file too short: {size} bytes" in msg


def test_refuses_truncated_payload(tmp_path, good):
    msg, handed = refused(write(tmp_path, good[1][:-1]))
    assert "file too short: 6015999 bytes" in msg and "1 bytes missing" in msg and not handed


def test_refuses_trailing_bytes(tmp_path, good):
    msg, handed = refused(write(tmp_path, good[1] + b"\0"))
    assert "1 trailing bytes" in msg and not handed


@pytest.mark.parametrize("attr, value, label", [
    ("payload_bytes", 5999620, "payload bytes differs: file 5999620 run 5999616"),
    ("chunk_bytes", 4194308, "chunk bytes differs: file 4194308 run 4194304"),
    ("run_steps", 10000, "run steps differs: file 10000 run 8"),
    ("parameter_count", 499969, "parameter count differs: file 499969 run 499968"),
    ("planes", 2, "planes differs: file 2 run 3"),
    ("bytes_per_scalar", 2, "bytes per scalar differs: file 2 run 4"),
    ("chunk_count", 3, "chunk count 3 differs from payload bytes / chunk bytes = 2"),
    ("identity_bytes", 435, "identity block has 1 bytes after the four identities"),
    ("identity_bytes", 433, "initialization identity length 65 runs past the identity block"),
])
def test_refuses_each_size_field(tmp_path, good, attr, value, label):
    h = CF.Header.decode(good[1])
    msg, handed = refused(write(tmp_path, with_header(good[1],
                                                      dataclasses.replace(h, **{attr: value}))))
    assert label in msg and not handed


@pytest.mark.parametrize("name, old, new", [
    ("state", b"parameter-order:p-then-m-then-v", b"parameter-order:v-then-m-then-p"),
    ("learner", b"|beta2=95|", b"|beta2=96|"),
    ("data", b"|header=16|", b"|header=32|"),
    ("initialization", b"|seed=20260925", b"|seed=20260926"),
])
def test_refuses_each_identity(tmp_path, good, name, old, new):
    h = CF.Header.decode(good[1])
    ids = dict(h.identities)
    assert old in ids[name]
    ids[name] = ids[name].replace(old, new)
    msg, handed = refused(write(tmp_path, with_header(good[1], dataclasses.replace(
        h, identities=ids))))
    assert f"{name} identity differs" in msg and not handed
    assert repr(new.strip(b"|").decode()) in msg and repr(old.strip(b"|").decode()) in msg, msg


def test_refuses_identity_of_other_length(tmp_path, good):
    h = CF.Header.decode(good[1])
    ids = dict(h.identities, learner=h.identities["learner"] + b"|extra=1")
    header = dataclasses.replace(h, identities=ids,
                                 identity_bytes=len(CF.identity_block(ids)))
    msg, _ = refused(write(tmp_path, with_header(good[1], header)))
    assert "learner identity differs: file …|'extra=1' run …|'<end>'" in msg


def test_refuses_flipped_bit_in_last_chunk_naming_it(tmp_path, good):
    data = bytearray(good[1])
    data[-1] ^= 0x01                     # the last element of the V plane
    msg, handed = refused(write(tmp_path, bytes(data)))
    assert "chunk 2 of 2 digest differs" in msg and "V plane, head" in msg, msg
    assert handed == [0], "chunk 2 was handed on before its digest was checked"


def test_numpy_load_refuses_flipped_bit_in_last_element(tmp_path, good):
    data = bytearray(good[1])
    data[-4] ^= 0x01                     # lowest mantissa bit of V's last element
    with pytest.raises(ckpt.CheckpointRefused, match="chunk 2 of 2 digest differs"):
        ckpt.load(write(tmp_path, bytes(data)), TINY)


def test_refuses_flipped_bit_in_first_chunk_before_handing_any(tmp_path, good):
    data = bytearray(good[1])
    data[CF.HEADER_BYTES] ^= 0x80
    msg, handed = refused(write(tmp_path, bytes(data)))
    assert "chunk 1 of 2 digest differs" in msg and "P plane, embed" in msg and handed == []


def test_refuses_tiny_checkpoint_for_coppelius_by_profile(tmp_path, good):
    msg, handed = refused(good[0], COPPELIUS)
    assert "state identity differs" in msg and "'payload=5999616'" in msg
    assert "the file is a 'tiny' checkpoint, this run uses profile 'coppelius'" in msg
    assert not handed


def test_refuses_coppelius_header_for_tiny(tmp_path):
    digests = [bytes(32)] * COPPELIUS.chunk_count
    header = CF.Header.for_profile(COPPELIUS, 1000, digests).encode()
    msg, _ = refused(write(tmp_path, header), TINY)
    assert "the file is a 'coppelius' checkpoint, this run uses profile 'tiny'" in msg


def test_load_refuses_zero_byte_file(tmp_path):
    msg, _ = refused(write(tmp_path, b""))
    assert "0 bytes" in msg


# ---------------------------------------------------------------------------- open_input

def test_open_input_missing_path_is_refused_with_fresh_hint(tmp_path):
    with pytest.raises(ckpt.CheckpointRefused) as e:
        ckpt.open_input(tmp_path / "typo.ckpt", TINY)
    assert "does not exist" in str(e.value) and f": > {tmp_path / 'typo.ckpt'}" in e.value.hint


def test_open_input_zero_bytes_is_fresh(tmp_path):
    p = write(tmp_path, b"")
    with ckpt.open_input(p, TINY) as inp:
        assert inp.fresh and inp.update_count == 0 and inp.stat.st_size == 0
        assert inp.stat.st_ino == os.stat(p).st_ino


def test_open_input_directory_is_refused(tmp_path):
    with pytest.raises(ckpt.CheckpointRefused, match="not a regular file"):
        ckpt.open_input(tmp_path, TINY)


def test_open_input_checks_header_at_once_and_keeps_its_fd(tmp_path, good):
    with pytest.raises(ckpt.CheckpointRefused, match="state identity differs"):
        ckpt.open_input(good[0], COPPELIUS)
    p = write(tmp_path, good[1])
    with ckpt.open_input(p, TINY) as inp:
        assert not inp.fresh and inp.update_count == 5
        ino = inp.stat.st_ino
        ckpt.publish(p, TINY, *planes(6), update_count=6)      # renamed over the path meanwhile
        after = inp.restat()
        assert after.st_ino == ino and after.st_nlink == 0   # still the file that was opened
        loaded = inp.load_chunks(lambda off, view: None)
        assert loaded.update_count == 5
    assert ckpt.load(p, TINY)[0] == 6


# ----------------------------------------------------------------------------------- lock

def test_lock_refuses_second_holder_at_once(tmp_path):
    p = tmp_path / "a.ckpt"
    with ckpt.lock(p) as lock_path:
        assert lock_path == f"{p}.lock"
        t0 = time.perf_counter()
        with pytest.raises(ckpt.CheckpointLocked) as e:
            with ckpt.lock(p):
                pass
        assert time.perf_counter() - t0 < 0.5
        assert f"{p}.lock is locked (held by pid {os.getpid()})" in str(e.value)
    assert not os.path.lexists(f"{p}.lock"), "the holder removes its lock file"
    with ckpt.lock(p):                          # released on exit, so it can be taken again
        assert os.path.exists(f"{p}.lock")
    assert sorted(os.listdir(tmp_path)) == []


def test_a_lock_file_left_by_a_killed_holder_is_taken_and_removed(tmp_path):
    """kill -9 leaves the file, unlocked: the next holder takes it and removes it."""
    p = tmp_path / "a.ckpt"
    Path(f"{p}.lock").write_text("12345\n")
    with ckpt.lock(p):
        assert Path(f"{p}.lock").read_text() == f"{os.getpid()}\n"
    assert not os.path.lexists(f"{p}.lock")


def test_a_lock_file_removed_under_a_taker_is_opened_again(tmp_path, monkeypatch):
    """A taker that opened the lock file just before its holder removed it, and locked it just
    after, holds a file no longer at the path: it must open the path again, so that it and a
    later taker of the new file never both hold the checkpoint."""
    import fcntl
    p = tmp_path / "a.ckpt"
    lock_path = f"{p}.lock"
    with ckpt.lock(p):
        early = os.open(lock_path, os.O_RDWR)    # opened while the holder still held it
    fcntl.flock(early, fcntl.LOCK_EX | fcntl.LOCK_NB)   # ... and locked once it let go
    real, calls = ckpt._lock_fd, []

    def first_the_orphan(*args):
        calls.append(args)
        return early if len(calls) == 1 else real(*args)
    monkeypatch.setattr(ckpt, "_lock_fd", first_the_orphan)
    with ckpt.lock(p):
        assert len(calls) == 2, "the orphaned file was not taken for the lock"
        monkeypatch.setattr(ckpt, "_lock_fd", real)
        with pytest.raises(ckpt.CheckpointLocked, match="is in use by another run"):
            with ckpt.lock(p):                  # the file at the path is the one held
                pass


def test_lock_in_missing_directory_is_refused(tmp_path):
    with pytest.raises(ckpt.CheckpointLocked, match=r"lock file .*: cannot create: .* \(ENOENT\)"):
        with ckpt.lock(tmp_path / "no" / "a.ckpt"):
            pass


# ------------------------------------------------------------------------------- failures

def test_publish_removes_only_dead_publishers_temporaries(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    names = {f".a.ckpt.tmp.{dead}.deadbeef": False,          # a killed publisher's: removed
             f".a.ckpt.tmp.{os.getppid()}.deadbeef": True,   # a live process's: kept
             f".a.ckpt.tmp.{dead}.tmp.{dead}.deadbeef": True,  # another path's (a.ckpt.tmp.N)
             ".a.ckpt.tmp.notes": True}
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    ckpt.publish(tmp_path / "a.ckpt", TINY, *planes(0), update_count=0)
    for name, kept in names.items():
        assert (tmp_path / name).exists() == kept, name


def test_failing_read_chunk_leaves_previous_and_no_temporary(tmp_path, good):
    p = write(tmp_path, good[1])

    def read_chunk(offset, nbytes, out):
        if offset:
            raise RuntimeError("device fault while copying chunk 2")
        out[:] = 7

    with pytest.raises(RuntimeError, match="device fault"):
        ckpt.publish_chunks(p, TINY, 6, read_chunk)
    assert p.read_bytes() == good[1] and os.listdir(tmp_path) == ["c.ckpt"]


def test_publish_into_missing_directory_reports_one_line(tmp_path):
    with pytest.raises(ckpt.CheckpointWriteFailed) as e:
        ckpt.publish(tmp_path / "no" / "a.ckpt", TINY, *planes(0), update_count=0)
    assert "publication failed creating the temporary: No such file or directory" in str(e.value)
    assert "nothing was written" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------- fuzz (hypothesis)

def _sealed(buf: bytearray) -> bytes:
    buf[CF.HEADER_DIGEST:] = hashlib.sha256(bytes(buf[:CF.HEADER_DIGEST])).digest()
    return bytes(buf)


def _decode_only_refuses(data: bytes) -> None:
    try:
        h = CF.Header.decode(data)
    except CF.CheckpointRefused as e:
        assert str(e) and "\n" not in str(e)
        return
    for prof in (TINY, COPPELIUS):
        try:
            CF.check_profile(h, prof)
        except CF.CheckpointRefused:
            pass


FUZZ = settings(max_examples=250, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.binary(max_size=CF.HEADER_BYTES + 64))
def test_fuzz_arbitrary_bytes_only_refuse(data):
    _decode_only_refuses(data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, CF.HEADER_DIGEST - 1), st.integers(0, 255)),
                min_size=1, max_size=12), st.booleans())
def test_fuzz_mutated_sealed_headers_only_refuse(edits, reseal):
    """Mutations that pass the header digest reach every later check."""
    base = bytearray(CF.Header.for_profile(TINY, 5, [bytes(32)] * 2).encode())
    hot = [8, 12, 24, 32, 40, 48, 56, 60, 64, 68, CF.IDENTITY_BLOCK, CF.IDENTITY_BLOCK + 70]
    for pos, value in edits:
        # half of the edits land on length and size fields, where parsing can go wrong
        base[hot[pos % len(hot)] if value % 2 else pos] = value
    _decode_only_refuses(_sealed(base) if reseal else bytes(base))


def test_encode_decode_round_trip_for_every_profile():
    for prof in (TINY, COPPELIUS):
        digests = [hashlib.sha256(bytes([i])).digest() for i in range(prof.chunk_count)]
        raw = CF.Header.for_profile(prof, 123, digests).encode()
        h = CF.Header.decode(raw)
        assert h.encode() == raw and h.profile_name() == prof.name
        CF.check_profile(h, prof)
