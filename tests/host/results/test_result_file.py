"""Result-file writer → reader round trips, every field, both profiles, every outcome."""
from __future__ import annotations

import os

import numpy as np
import pytest

from coppelius.results import reader as RF
from coppelius.results.writer import ResultRefused, ResultWriter
from coppelius.staging.errors import UserError
from coppelius.plan import profiles as P
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS
from coppelius.staging.views import StagingViews, allocate_host

from tests.support.result_synth import synthesize

OUTCOMES = sorted(R.OUTCOMES)
# coppelius stays small here (a few steps); the production-size file is in test_inspect/test_diff
CASES = [("tiny", o, None) for o in OUTCOMES] + [("coppelius", o, 3) for o in OUTCOMES] + \
    [("tiny", R.OUTCOME_DEVICE_ERROR, 0), ("coppelius", R.OUTCOME_HOST_ERROR, 0),
     ("tiny", R.OUTCOME_INTERRUPTED, 7)]


def _worst(a: np.ndarray, b: np.ndarray) -> str:
    bad = np.flatnonzero(a.reshape(-1).view(np.uint32) != b.reshape(-1).view(np.uint32))
    if not bad.size:
        return "equal"
    k = int(bad[0])
    return f"{bad.size} words differ, first at flat index {k}: {a.reshape(-1)[k]} vs {b.reshape(-1)[k]}"


@pytest.mark.parametrize("name,outcome,steps", CASES)
def test_round_trip_every_field(tmp_path, name, outcome, steps):
    prof = P.get(name)
    syn = synthesize(prof, outcome=outcome, steps=steps, seed=outcome + 11)
    path = tmp_path / "r.res"
    syn.write(path)
    data = path.read_bytes()
    assert data == syn.expected_bytes()
    rf = RF.read(path)
    n = syn.windows.shape[0]
    issues = len(syn.timestamps) // L.TIMESTAMP_ENTRY_BYTES
    assert rf.profile is prof
    assert (rf.steps, rf.issues, rf.steps_completed) == (n, issues, n)
    assert rf.size == rf.expected_size == len(data) == RS.result_file_bytes(prof, n, issues)
    assert rf.outcome_code == outcome and rf.outcome == R.OUTCOMES[outcome]
    # float sections: bit-exact, right shapes, and views into the mapped file, not copies
    fwd = np.frombuffer(syn.forward, "<f4").reshape(3, prof.vocab)
    for got, want, shape in ((rf.forward, fwd, (3, prof.vocab)),
                             (rf.losses, syn.windows, (n, 1024)),
                             (rf.loss_block, np.frombuffer(syn.loss_block, "<f4").reshape(4, 1024),
                              (4, 1024)),
                             (rf.final, np.frombuffer(syn.final, "<f4"), (prof.vocab,))):
        assert got.shape == shape
        assert got.tobytes() == want.tobytes(), _worst(got, want)
        assert (got.size == 0 or np.shares_memory(got, rf.raw)) and not got.flags.writeable
    # records: every field equals what was packed
    for got, rec, want in ((rf.stat, R.STAT_RECORD, syn.stat),
                           (rf.error_notifier, R.ERROR_NOTIFIER, syn.error_notifier),
                           (rf.status, RF.STATUS_FIELDS, RF.status_fields(syn.status).tobytes())):
        want_fields = rec.unpack(want)
        got_fields = rec.unpack(got.tobytes())
        for k, v in want_fields.items():
            assert np.array_equal(got_fields[k], v), f"{rec.name}.{k}: {got_fields[k]} vs {v}"
    assert rf.semaphores.shape == (3,) and rf.semaphores.tobytes() == syn.semaphores
    assert rf.timestamps.shape == (issues,) and rf.timestamps.tobytes() == syn.timestamps
    ts = np.frombuffer(syn.timestamps, R.TIMESTAMP_ENTRY.dtype)
    for field in R.TIMESTAMP_ENTRY.fields:
        assert np.array_equal(rf.timestamps[field], ts[field]), field
    assert rf.warnings() == [] or (outcome == 0 and n != prof.steps)
    # section table: contiguous, in file order, ending at the size
    ends = [o + s for o, s in rf.offsets.values()]
    starts = [o for o, _ in rf.offsets.values()]
    assert starts[0] == 0 and starts[1:] == ends[:-1] and ends[-1] == rf.size
    assert list(rf.offsets) == list(RS.NAMES)


def test_production_size_formula():
    prof = P.get("coppelius")
    assert RS.result_file_bytes(prof, prof.steps, prof.steps + 2) == 41_813_600


def test_same_parts_same_bytes(tmp_path):
    prof = P.get("tiny")
    a, b = tmp_path / "a", tmp_path / "b"
    synthesize(prof, seed=5).write(a)
    synthesize(prof, seed=5).write(b)
    assert a.read_bytes() == b.read_bytes()


def test_writer_takes_staging_views(tmp_path):
    """The run loop hands over staging views (numpy, poisoned where the device did not write)."""
    prof = P.get("tiny")
    buf = allocate_host()
    v = StagingViews(buf, prof)
    rng = np.random.default_rng(3)
    v.record_forward[:] = rng.normal(size=v.record_forward.shape)
    syn = synthesize(prof, outcome=R.OUTCOME_COMPLETED, steps=prof.steps)
    path = tmp_path / "r.res"
    with ResultWriter.create(path, prof) as w:
        w.write_forward(v.record_forward)
        for s in range(prof.steps):
            v.loss_record[:] = syn.windows[s]
            w.append_step(v.loss_record)
        # final part left poisoned: the file carries it as it is
        w.write_tail(syn.stat, v.loss_block, v.record_final,
                     v.bytes_at(L.SEMAPHORES, L.SEMAPHORE_REGION_BYTES),
                     v.error_notifier, syn.status, syn.timestamps)
        assert w.steps_written == prof.steps
    rf = RF.read(path)
    assert rf.forward.tobytes() == v.record_forward.tobytes()
    assert rf.losses.tobytes() == syn.windows.tobytes()
    assert set(rf.final.view(np.uint8).tolist()) == {L.POISON_BYTE}
    assert set(rf.loss_block.view(np.uint8).reshape(-1).tolist()) == {L.POISON_BYTE}


def test_refuses_existing_path_unless_overwrite(tmp_path):
    prof = P.get("tiny")
    path = tmp_path / "r.res"
    path.write_bytes(b"earlier evidence")
    with pytest.raises(ResultRefused) as e:
        ResultWriter.create(path, prof)
    assert isinstance(e.value, UserError)
    assert str(path) in e.value.message and "--overwrite" in e.value.hint
    assert path.read_bytes() == b"earlier evidence"
    synthesize(prof).write(path, overwrite=True)
    assert RF.read(path).steps == prof.steps


def test_refuses_missing_directory(tmp_path):
    with pytest.raises(ResultRefused, match=r"result file .*r\.res: cannot create: No such file"):
        ResultWriter.create(tmp_path / "no" / "r.res", P.get("tiny"))


def test_each_step_reaches_the_file_without_fsync(tmp_path, monkeypatch):
    """A killed run's file holds every observed step: windows are written at once, synced once."""
    prof = P.get("tiny")
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd))[1])
    syn = synthesize(prof)
    path = tmp_path / "r.res"
    fwd = L.record_forward_bytes(prof)
    w = ResultWriter.create(path, prof)
    w.write_forward(syn.forward)
    for s in range(3):
        w.append_step(syn.windows[s])
        assert os.path.getsize(path) == fwd + (s + 1) * L.STEP_WINDOW_BYTES
        assert path.read_bytes()[-L.STEP_WINDOW_BYTES:] == syn.windows[s].tobytes()
    assert syncs == []
    w.close()
    assert len(syncs) == 2          # the file, then its directory
    w.close()                       # idempotent
    assert len(syncs) == 2
    with pytest.raises(RuntimeError):
        w.append_step(syn.windows[0])


def test_writer_checks_sizes_order_and_consistency(tmp_path):
    prof = P.get("tiny")
    syn = synthesize(prof, steps=prof.steps)
    with ResultWriter.create(tmp_path / "r.res", prof) as w:
        with pytest.raises(RuntimeError):
            w.append_step(syn.windows[0])                 # before the forward part
        with pytest.raises(ValueError, match="forward part is 6143 bytes"):
            w.write_forward(syn.forward[:-1])
        w.write_forward(syn.forward)
        with pytest.raises(RuntimeError):
            w.write_forward(syn.forward)
        with pytest.raises(ValueError, match="step window is 4100 bytes"):
            w.append_step(syn.windows[0].tobytes() + b"1234")
        for row in syn.windows[:-1]:
            w.append_step(row)
        tail = dict(stat=syn.stat, loss_block=syn.loss_block, final_part=syn.final,
                    semaphores=syn.semaphores, error_notifier=syn.error_notifier,
                    status=syn.status, timestamps=syn.timestamps)
        with pytest.raises(ValueError, match="steps_completed 8 but 7 step windows"):
            w.write_tail(**tail)
        w.append_step(syn.windows[-1])
        with pytest.raises(ValueError, match="gp_put 10 but the timestamp table has 9"):
            w.write_tail(**dict(tail, timestamps=syn.timestamps[:-L.TIMESTAMP_ENTRY_BYTES]))
        with pytest.raises(ValueError, match="whole number"):
            w.write_tail(**dict(tail, timestamps=syn.timestamps[:-1]))
        with pytest.raises(ValueError, match="final part is 2044 bytes"):
            w.write_tail(**dict(tail, final_part=syn.final[:-4]))
        w.write_tail(**tail)
        with pytest.raises(RuntimeError):
            w.write_tail(**tail)
    assert (tmp_path / "r.res").read_bytes() == syn.expected_bytes()


def test_surviving_marker_is_flagged(tmp_path):
    prof = P.get("tiny")
    syn = synthesize(prof)
    syn.final = L.RECORD_MARKER + syn.final[len(L.RECORD_MARKER):]
    syn.write(tmp_path / "r.res")
    assert any("final part still starts with the record marker" in w
               for w in RF.read(tmp_path / "r.res").warnings())


def test_timing_helpers(tmp_path):
    prof = P.get("tiny")
    syn = synthesize(prof, outcome=R.OUTCOME_DEVICE_ERROR, steps=5)
    syn.write(tmp_path / "r.res")
    rf = RF.read(tmp_path / "r.res")
    ts = np.frombuffer(syn.timestamps, R.TIMESTAMP_ENTRY.dtype)
    # forward, 5 updates, 1 failed update (no fence): 5 timed updates
    upd = ts[(ts["submission"] == 1) & (ts["flags"] & 1 == 1)]
    assert upd.size == 5
    assert np.array_equal(rf.device_step_ns(),
                          upd["device_final_ns"].astype(np.int64)
                          - upd["device_prelaunch_ns"].astype(np.int64))
    gaps = rf.host_gaps_ns()
    assert gaps.shape == (6,)
    assert gaps[2] == int(ts["host_issue_ns"][3]) - int(ts["host_fence_ns"][2])
    assert np.allclose(rf.step_losses(), syn.windows.astype(np.float64).mean(axis=1),
                       rtol=0, atol=1e-12)


def test_the_notifier_is_cleared_to_zero_bytes_on_poisoned_staging():
    """A run's clearing leaves every notifier byte 0 but `step` (0xFFFFFFFF): `reason` is 40 NULs,
    not the digit "0" that a structured fill(0) would store there."""
    from coppelius.run.records import Notifier
    views = StagingViews(allocate_host(), P.get("tiny"))    # poisoned: every byte 0xA5
    Notifier(views.error_notifier[0], ring=None)            # the ring is read only when filled
    want = bytes(20) + R.NOTIFIER_NO_STEP.to_bytes(4, "little") + bytes(40)   # offsets 20, 24
    got = views.error_notifier.tobytes()
    assert got == want, f"first differing byte {next(i for i in range(64) if got[i] != want[i])}"


@pytest.mark.parametrize("time_ns,status,warning", [
    (1, R.NOTIFIER_STATUS_NONE, None),
    (0, R.NOTIFIER_STATUS_NONE, "outcome interrupted but the error notifier is not filled"),
    (1, R.NOTIFIER_STATUS_ERROR, "outcome interrupted but the error notifier holds an error"),
])
def test_an_interrupted_runs_notifier_is_filled_with_status_none(tmp_path, time_ns, status,
                                                                 warning):
    prof = P.get("tiny")
    syn = synthesize(prof, outcome=R.OUTCOME_INTERRUPTED, steps=3)
    fields = R.ERROR_NOTIFIER.unpack(syn.error_notifier)
    syn.error_notifier = R.ERROR_NOTIFIER.pack(**dict(fields, time_ns=time_ns, status=status))
    syn.write(tmp_path / "r.res")
    warnings = RF.read(tmp_path / "r.res").warnings()
    assert warnings == ([] if warning is None else [warning])
