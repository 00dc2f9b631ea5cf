"""Every field the readers take from a file, at the limits of its type, through the commands a
user runs on it (hypothesis, derandomized): the result file's status block (either version: c0,
steps, the update count it implies, gpGet/gpPut, publications, backend, versions), stat record,
error notifier, semaphores and timestamp entries; the checkpoint header's counts and sizes
(resealed, so that the field checks are reached); the token cache's header.  Each command either
reads the file exactly or refuses it by name — exit 2, one line — and never with a traceback, and
`diff` never answers a refusal with 1 (the exit status that says "files differ").

A version-2 status block whose c0 + steps_completed passes 2⁶⁴ − 1 once made `inspect`, `diff`
and the forensics API fail with an OverflowError (`status_fields` derives version 1's
update_count from them)."""
from __future__ import annotations

import functools
import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from coppelius import checkpoints as ckpt
from coppelius import cli
from coppelius import forensics
from coppelius.checkpoints import format as CF
from coppelius.plan import profiles
from coppelius.results import reader as RF
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS
from coppelius.staging import tokens as tk

from tests.host.results.test_status_v2 import as_v2
from tests.support.result_synth import synthesize

TINY = profiles.get("tiny")
LIMITS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.function_scoped_fixture])
EXIT_REFUSED = 2
DIFFERENT = 1


class Reached(Exception):
    """A run passed every check: it would open a backend now."""


@pytest.fixture(autouse=True)
def no_backend(monkeypatch):
    from coppelius.run import loop

    def reached(*args, **kwargs):
        raise Reached()
    monkeypatch.setattr(loop, "make_backend", reached)


def limits(dtype) -> st.SearchStrategy:
    """A field's extreme values (0, 1, the largest, around the sign bit), or any of its type."""
    info = np.iinfo(dtype)
    edges = {int(x) for x in (info.min, info.min + 1, -1, 0, 1, 2, info.max - 1, info.max,
                              info.max // 2, info.max // 2 + 1) if info.min <= x <= info.max}
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(int(info.min), int(info.max)))


def call(capsys, argv) -> tuple[int, str]:
    """`coppelius ARGV`: (exit status, stderr); a refusal is one line without a traceback."""
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    if rc == EXIT_REFUSED:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.err, out.err
    return rc, out.err


# ------------------------------------------------------------------------------ result file

@functools.lru_cache(None)
def result_bytes(version: int) -> bytes:
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r")
        synthesize(TINY, seed=version).write(path)
        data = bytearray(open(path, "rb").read())
    if version == 2:
        prof, steps, issues, _ = RF.locate(np.frombuffer(bytes(data), np.uint8), len(data))[0]
        at = RS.section_offsets(prof, steps, issues)["status"][0]
        data[at:at + L.STATUS_BLOCK_BYTES] = as_v2(bytes(data[at:at + L.STATUS_BLOCK_BYTES]))
    return bytes(data)


def integer_fields(record: R.Record) -> list[str]:
    return [n for n in record.dtype.names
            if record.dtype.fields[n][0].kind in "iu" and not record.dtype.fields[n][0].shape]


# (section, record, which unit of a repeated section: 0 the first, -1 the last)
RECORDS = [("status", None, 0), ("stat", R.STAT_RECORD, 0),
           ("error_notifier", R.ERROR_NOTIFIER, 0), ("semaphores", R.SEMAPHORE_SLOT, 0),
           ("semaphores", R.SEMAPHORE_SLOT, -1), ("timestamps", R.TIMESTAMP_ENTRY, 0),
           ("timestamps", R.TIMESTAMP_ENTRY, -1)]


def field_edits(version: int):
    status = R.STATUS_BLOCK if version == 1 else R.STATUS_BLOCK_V2
    choices = [(k, name, (rec or status).dtype.fields[name][0])
               for k, (_, rec, _) in enumerate(RECORDS) for name in integer_fields(rec or status)
               if name != "magic"]
    return st.lists(st.sampled_from(choices).flatmap(
        lambda c: st.tuples(st.just(c[0]), st.just(c[1]), limits(c[2]))), min_size=1,
        max_size=3)


def edited_result(version: int, edits) -> bytes:
    base = result_bytes(version)
    prof, steps, issues, _ = RF.locate(np.frombuffer(base, np.uint8), len(base))[0]
    off = RS.section_offsets(prof, steps, issues)
    data = bytearray(base)
    status = R.STATUS_BLOCK if version == 1 else R.STATUS_BLOCK_V2
    for k, name, value in edits:
        section, rec, unit = RECORDS[k]
        rec = rec or status
        start, size = off[section]
        at = start + (size - rec.itemsize if unit == -1 else 0)
        one = np.frombuffer(data, rec.dtype, 1, at).copy()
        one[0][name] = value
        data[at:at + rec.itemsize] = one.tobytes()
    return bytes(data)


def check_result_commands(capsys, path, base) -> None:
    try:
        RF.read(path)
        readable = True
    except RF.ResultFileError:
        readable = False
    for argv in (["inspect", path], ["inspect", path, "--json"],
                 ["inspect", path, "--stream", "embedded"]):
        rc, err = call(capsys, argv)
        assert rc in (0, EXIT_REFUSED), (argv, err)
        assert (rc == 0) == readable or rc == EXIT_REFUSED, (argv, err)
    for argv in (["diff", base, path], ["diff", base, path, base],
                 ["diff", base, path, "--across-backends"]):
        rc, err = call(capsys, argv)
        assert rc == (EXIT_REFUSED if not readable else rc), (argv, rc, err)
        assert rc in ((0, DIFFERENT) if readable else (EXIT_REFUSED,)), (argv, rc, err)
    try:                                    # the Python API: a refusal is its UserError
        forensics.compare_results(base, path)
        forensics.summarize_run(path)
    except RF.ResultFileError:
        assert not readable


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("limits")


@pytest.mark.parametrize("version", [1, 2])
def test_result_fields_at_their_limits(scratch, capsys, version):
    base = scratch / f"base-v{version}.bin"
    base.write_bytes(result_bytes(version))

    @LIMITS
    @given(edits=field_edits(version))
    @example(edits=[(0, "c0", 2 ** 64 - 1)])                 # the fuzzer's OverflowError
    @example(edits=[(0, "c0", 2 ** 64 - 2), (0, "steps_planned", 2 ** 64 - 1)])
    @example(edits=[(0, "steps_planned", 0)])
    def check(edits):
        path = scratch / f"m-v{version}.bin"
        path.write_bytes(edited_result(version, edits))
        check_result_commands(capsys, path, base)
    check()


def test_an_update_count_past_u64_is_refused_by_name(scratch, capsys):
    path = scratch / "c0.bin"
    path.write_bytes(edited_result(2, [(0, "c0", 2 ** 64 - 1)]))
    rc, err = call(capsys, ["inspect", path])
    assert rc == EXIT_REFUSED and "c0" in err and "steps_completed" in err, err
    rc, err = call(capsys, ["diff", path, path])
    assert rc == EXIT_REFUSED, err
    rc, err = call(capsys, ["verify", path, "--steps", "1"])       # 1 would say "not verified"
    assert rc == EXIT_REFUSED, err


# ------------------------------------------------------------------------------- checkpoint

@functools.lru_cache(1)
def checkpoint_bytes() -> bytes:
    import os
    import tempfile
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    with tempfile.TemporaryDirectory() as d:
        ckpt.publish(os.path.join(d, "c"), TINY, P, P, P, update_count=3)
        return open(os.path.join(d, "c"), "rb").read()


HEADER_FIELDS = [(attr, off, fmt) for attr, off, fmt, _ in CF._FIELDS]


def resealed(edits) -> bytes:
    buf = bytearray(checkpoint_bytes())
    for k, value in edits:
        _, off, fmt = HEADER_FIELDS[k]
        struct.pack_into(fmt, buf, off, value % (1 << (8 * struct.calcsize(fmt))))
    buf[CF.HEADER_DIGEST:CF.HEADER_BYTES] = hashlib.sha256(bytes(buf[:CF.HEADER_DIGEST])).digest()
    return bytes(buf)


def header_edits():
    return st.lists(st.integers(0, len(HEADER_FIELDS) - 1).flatmap(
        lambda k: st.tuples(st.just(k), limits(np.uint64 if HEADER_FIELDS[k][2] == "<Q"
                                               else np.uint32))), min_size=1, max_size=3)


@LIMITS
@given(edits=header_edits())
@example(edits=[(0, 2 ** 64 - 1)])                      # the update count at its largest
def test_checkpoint_header_fields_at_their_limits(scratch, capsys, edits):
    path = scratch / "m.ckpt"
    path.write_bytes(resealed(edits))
    for argv in (["checkpoint", "show", path], ["checkpoint", "show", path, "--json"],
                 ["checkpoint", "verify", path], ["checkpoint", "show", path, "--profile", "tiny"],
                 ["eval", path, "--tokens", scratch / "c.tokens", "--contexts", "1",
                  "--backend", "reference"],
                 ["export", path, scratch / "never"]):
        rc, err = call(capsys, argv)
        assert rc in (0, EXIT_REFUSED), (argv, err)
    assert not (scratch / "never").exists() or (scratch / "never" / "config.json").is_file()
    try:
        rc, err = call(capsys, ["run", "--profile", "tiny", "--checkpoint", path, "--tokens",
                                scratch / "c.tokens", "--result", scratch / "never.bin",
                                "--steps", "1", "--quiet"])
        assert rc == EXIT_REFUSED, err
    except Reached:
        assert path.read_bytes() == resealed(edits)
    assert not (scratch / "never.bin").exists()


@pytest.fixture(scope="module", autouse=True)
def a_cache(scratch):
    ids = np.random.default_rng(2).integers(0, TINY.vocab, 12 * TINY.context + 1, dtype="<u4")
    (scratch / "c.tokens").write_bytes(tk.header_bytes(1, 1) + ids.tobytes())


# ------------------------------------------------------------------------------ token cache

@settings(LIMITS, max_examples=20)            # each example evaluates a context: 0.3 s
@given(mtime=limits(np.int64), size=limits(np.uint64), c0=st.sampled_from([0, 1, 2 ** 63]))
@example(mtime=0, size=0, c0=0)                         # a zero header: the embedded stream's
def test_token_cache_header_at_its_limits(scratch, capsys, mtime, size, c0):
    ids = np.random.default_rng(4).integers(0, TINY.vocab, 3 * TINY.context + 1, dtype="<u4")
    path = scratch / "h.tokens"
    path.write_bytes(tk.header_bytes(mtime, size) + ids.tobytes())
    source = scratch / "src.txt"
    source.write_text("text\n")
    argv = ["run", "--profile", "tiny", "--tokens", path, "--source", source, "--result",
            scratch / "never.bin", "--directory", scratch / "d", "--steps", "1", "--quiet"]
    with pytest.raises((Reached, AssertionError)) as e:
        rc, err = call(capsys, argv)
        assert rc == EXIT_REFUSED and "token cache" in err, err
        raise AssertionError("refused")
    assert e.type is AssertionError and str(e.value) == "refused", "a stale header was taken"
    ck = scratch / f"k{c0}.ckpt"
    if not ck.exists():
        P = np.zeros(TINY.parameter_count, np.float32)
        ckpt.publish(ck, TINY, P, P, P, update_count=c0)
    rc, err = call(capsys, ["eval", ck, "--tokens", path, "--contexts", "1", "--backend",
                            "reference"])
    assert rc in (0, EXIT_REFUSED), err
    assert (rc == 0) == (c0 < 3 and (mtime, size) != (0, 0)), err
