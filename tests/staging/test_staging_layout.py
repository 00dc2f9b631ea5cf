"""Staging layout (CONTRACT §6) and record layouts (CONTRACT §7–§8): every offset pinned, records
round-trip."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from coppelius.plan import profiles
from coppelius.staging import layout as L, records as R, result_sections as RS, views


def test_staging_offsets():
    assert (L.INPUTS, L.TARGETS, L.SEMAPHORES, L.ERROR_NOTIFIER, L.DOORBELL) == \
        (0x000000, 0x001000, 0x010000, 0x010100, 0x010180)
    assert (L.LOSS_BLOCK, L.LOSS_RECORD, L.PREDICTIONS, L.RECORD, L.TRANSFER_WINDOW) == \
        (0x180000, 0x190000, 0x1F0000, 0x200000, 0x400000)
    assert L.REGION_BYTES == 8 * 1024 * 1024
    assert L.TRANSFER_WINDOW_BYTES == 4 * 1024 * 1024 == profiles.CHUNK_BYTES
    assert L.TRANSFER_WINDOW + L.TRANSFER_WINDOW_BYTES == L.REGION_BYTES
    assert L.LOSS_BLOCK_BYTES == 16384 and L.LOSS_RECORD_BYTES == 4096
    assert L.PREDICTIONS_BYTES == 24 and L.SEMAPHORE_REGION_BYTES == 96
    assert [L.semaphore_slot(i) for i in range(3)] == [0x010000, 0x010020, 0x010040]
    assert [L.loss_window(i) for i in range(4)] == [0x180000, 0x181000, 0x182000, 0x183000]
    assert L.RECORD_MARKER == b"\xbe\xba\xfe\xca\xbe\xba\xfe\xca"
    # fields do not overlap, in address order
    spans = [(L.INPUTS, 4096), (L.TARGETS, 4096), (L.SEMAPHORES, 96), (L.ERROR_NOTIFIER, 64),
             (L.DOORBELL, 4), (L.LOSS_BLOCK, 16384), (L.LOSS_RECORD, 4096), (L.PREDICTIONS, 24),
             (L.RECORD, L.record_bytes(profiles.get("coppelius"))), (L.TRANSFER_WINDOW, 4 << 20)]
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b, hex(b)


@pytest.mark.parametrize("name,fwd,fin", [("coppelius", 147456, 49152), ("tiny", 6144, 2048)])
def test_record_parts(name, fwd, fin):
    p = profiles.get(name)
    assert L.record_forward_bytes(p) == fwd and L.record_final_bytes(p) == fin
    assert L.record_final_offset(p) == L.RECORD + fwd
    L.check_layout(p)


def test_result_file_size_formula():
    p = profiles.get("coppelius")
    assert RS.result_file_bytes(p, 10000, 10002) == 41_813_600


@pytest.mark.parametrize("name", ["coppelius", "tiny"])
@pytest.mark.parametrize("steps,issues", [(0, 0), (1, 3), (7, 2), (10000, 10002)])
def test_result_file_size_is_the_spec_formula(name, steps, issues):
    """CONTRACT §9 spelled out: the section table must add up to it, section by section."""
    p = profiles.get(name)
    V = p.vocab
    want = [3 * V * 4, 4096 * steps, 160, 16384, V * 4, 32 * 3, 64, 160, 64 * issues]
    got = RS.section_offsets(p, steps, issues)
    assert list(got) == ["forward", "steps", "stat", "loss_block", "final", "semaphores",
                         "error_notifier", "status", "timestamps"] == list(RS.NAMES)
    assert [size for _, size in got.values()] == want
    starts = [o for o, _ in got.values()]
    assert starts == [sum(want[:k]) for k in range(len(want))]
    assert RS.result_file_bytes(p, steps, issues) == sum(want)
    assert sum(s.nbytes(p, steps, issues) for s in RS.TAIL) == sum(want[2:])


def test_record_sizes_equal_the_sizes_layout_reserves():
    """A record written into a slot of the staging region or the result file fills it exactly."""
    for rec, reserved in ((R.SEMAPHORE_RECORD, L.SEMAPHORE_RECORD_BYTES),
                          (R.SEMAPHORE_SLOT, L.SEMAPHORE_SLOT_BYTES),
                          (R.ERROR_NOTIFIER, L.ERROR_NOTIFIER_BYTES),
                          (R.PREDICTION, L.PREDICTION_BYTES),
                          (R.STATUS_BLOCK, L.STATUS_BLOCK_BYTES),
                          (R.STAT_RECORD, L.STAT_RECORD_BYTES),
                          (R.TIMESTAMP_ENTRY, L.TIMESTAMP_ENTRY_BYTES)):
        assert rec.itemsize == rec.dtype.itemsize == reserved, rec.name
    assert L.SEMAPHORE_SLOT_BYTES == 2 * L.SEMAPHORE_RECORD_BYTES          # final, pre-launch
    assert L.SLOT_PRELAUNCH_RELEASE == L.SEMAPHORE_RECORD_BYTES
    assert L.PREDICTIONS_BYTES == L.PREDICTION_COUNT * R.PREDICTION.itemsize


@pytest.mark.parametrize("name", ["coppelius", "tiny"])
def test_section_table_agrees_with_the_staging_layout(name):
    """The sections the run copies out of staging have the sizes staging reserves for them."""
    p = profiles.get(name)
    S = RS.SECTION
    assert S["forward"].nbytes(p, 0, 0) == L.record_forward_bytes(p)
    assert S["final"].nbytes(p, 0, 0) == L.record_final_bytes(p)
    assert S["steps"].unit_bytes(p) == L.STEP_WINDOW_BYTES == L.LOSS_RECORD_BYTES
    assert S["loss_block"].nbytes(p, 0, 0) == L.LOSS_BLOCK_BYTES
    assert S["semaphores"].nbytes(p, 0, 0) == L.SEMAPHORE_REGION_BYTES
    assert S["error_notifier"].nbytes(p, 0, 0) == L.ERROR_NOTIFIER_BYTES
    assert S["stat"].nbytes(p, 0, 0) == L.STAT_RECORD_BYTES
    assert S["status"].nbytes(p, 0, 0) == L.STATUS_BLOCK_BYTES
    assert S["timestamps"].unit_bytes(p) == L.TIMESTAMP_ENTRY_BYTES
    # the reader's search needs a step window to be a whole number of timestamp entries
    assert S["steps"].unit_bytes(p) % S["timestamps"].unit_bytes(p) == 0
    # and the status block to be followed by the timestamp table alone
    assert RS.NAMES[-2:] == ("status", "timestamps")


def test_section_views_are_typed_and_zero_copy():
    p = profiles.get("tiny")
    steps, issues = 3, 5
    raw = np.zeros(RS.result_file_bytes(p, steps, issues), np.uint8)
    off = RS.section_offsets(p, steps, issues)
    views = {s.name: s.view(raw, off[s.name][0], p, steps, issues) for s in RS.SECTIONS}
    assert views["forward"].shape == (3, p.vocab) and views["steps"].shape == (steps, 1024)
    assert views["loss_block"].shape == (4, 1024) and views["final"].shape == (p.vocab,)
    assert views["semaphores"].shape == (3,) and views["timestamps"].shape == (issues,)
    for name in ("stat", "error_notifier", "status"):
        assert isinstance(views[name], np.void) and views[name].dtype == RS.SECTION[name].dtype
    views["status"]["gp_put"] = 0x01020304                 # a view, not a copy
    at = off["status"][0] + R.STATUS_BLOCK.offset("gp_put")
    assert bytes(raw[at:at + 4]) == bytes([4, 3, 2, 1])
    views["timestamps"][-1]["flags"] = 9
    assert raw[-4] == 9


@pytest.mark.parametrize("rec,size", [(R.SEMAPHORE_RECORD, 16), (R.SEMAPHORE_SLOT, 32),
                                      (R.TIMESTAMP_ENTRY, 64), (R.ERROR_NOTIFIER, 64),
                                      (R.STATUS_BLOCK, 160), (R.STAT_RECORD, 160)])
def test_record_itemsize(rec, size):
    assert rec.itemsize == rec.dtype.itemsize == size


FIELD_OFFSETS = {
    R.SEMAPHORE_RECORD: {"payload": 0, "zero": 4, "timestamp": 8},
    R.SEMAPHORE_SLOT: {"final_payload": 0, "final_timestamp": 8, "prelaunch_payload": 16,
                       "prelaunch_timestamp": 24},
    R.TIMESTAMP_ENTRY: {"submission": 0, "sequence": 4, "context": 8, "host_issue_ns": 16,
                        "device_prelaunch_ns": 24, "device_final_ns": 32, "host_fence_ns": 40,
                        "host_wall_issue_ns": 48, "step": 56, "flags": 60},
    R.ERROR_NOTIFIER: {"time_ns": 0, "info32": 8, "info16": 12, "status": 14, "sequence": 16,
                       "step": 20, "reason": 24},
    R.STATUS_BLOCK: {"magic": 0, "version": 8, "outcome": 12, "c0": 16, "steps_planned": 24,
                     "steps_completed": 32, "update_count": 40, "gp_get": 48, "gp_put": 52,
                     "publications": 56, "backend": 60, "wall_ns": 64, "predictions": 72,
                     "compute_capability": 96, "driver_version": 100, "checkpoint_sha256": 104,
                     "device_name": 136},
    R.STAT_RECORD: {"st_dev": 0, "st_ino": 8, "st_size": 16, "st_mode": 24, "st_nlink": 28,
                    "st_uid": 32, "st_gid": 36, "st_atime_ns": 40, "st_mtime_ns": 48,
                    "st_ctime_ns": 56, "st_blocks": 64, "st_blksize": 72, "update_count": 80,
                    "gp_get": 96, "gp_put": 100, "semaphore_word": 104, "payload_sha256": 112},
}


@pytest.mark.parametrize("rec", list(FIELD_OFFSETS), ids=lambda r: r.name)
def test_field_offsets(rec):
    for field, off in FIELD_OFFSETS[rec].items():
        assert rec.offset(field) == off, field


def test_fields_cover_every_byte_once():
    for rec in R.ALL:
        covered = np.zeros(rec.itemsize, int)
        for name in rec.fields:
            dt, off = rec.dtype.fields[name][:2]
            covered[off:off + dt.itemsize] += 1
        assert (covered == 1).all(), rec.name


def test_little_endian_bytes():
    b = R.STAT_RECORD.pack(gp_get=0x01020304, gp_put=5, semaphore_word=0xAABBCCDD)
    assert b[96:100] == bytes([4, 3, 2, 1]) and b[104:108] == bytes([0xDD, 0xCC, 0xBB, 0xAA])
    s = R.STATUS_BLOCK.pack(magic=R.STATUS_MAGIC, version=1, device_name="NVIDIA H200")
    assert s[:8] == b"COPPSTAT" and s[8:12] == b"\x01\0\0\0" and s[136:147] == b"NVIDIA H200"


def _strategy(rec):
    fields = {}
    for name in rec.fields:
        dt = rec.dtype.fields[name][0]
        if dt.kind == "S":
            fields[name] = st.binary(min_size=dt.itemsize, max_size=dt.itemsize)
        elif dt.subdtype is not None:
            base, shape = dt.subdtype
            n = int(np.prod(shape))
            hi = np.iinfo(base).max
            fields[name] = st.lists(st.integers(0, hi), min_size=n, max_size=n).map(
                lambda xs, shape=shape, base=base: np.array(xs, base).reshape(shape))
        else:
            info = np.iinfo(dt)
            fields[name] = st.integers(int(info.min), int(info.max))
    return st.fixed_dictionaries(fields)


@pytest.mark.parametrize("rec", R.ALL, ids=lambda r: r.name)
def test_round_trip(rec):
    @settings(max_examples=60, deadline=None)
    @given(_strategy(rec))
    def check(values):
        raw = rec.pack(**values)
        assert len(raw) == rec.itemsize
        back = rec.unpack(raw)
        for k, v in values.items():
            if isinstance(v, np.ndarray):
                assert np.array_equal(back[k], v), k
            else:
                assert back[k] == v, k
        assert rec.pack(**back) == raw
    check()


def test_unpack_refuses_wrong_size():
    with pytest.raises(R.RecordError, match="status block: 159 bytes, expected 160"):
        R.STATUS_BLOCK.unpack(bytes(159))


def test_views_alias_the_buffer_and_poison():
    p = profiles.get("tiny")
    buf = views.allocate_host()
    assert buf.ctypes.data % 4096 == 0
    assert (buf == L.POISON_BYTE).all()
    v = views.StagingViews(buf, p)
    v.inputs[-1] = 0x11223344
    assert bytes(buf[L.INPUTS + 4092:L.INPUTS + 4096]) == b"\x44\x33\x22\x11"
    v.targets[0] = 7
    assert buf[L.TARGETS] == 7
    v.semaphores[2]["final_payload"] = 9
    assert buf[L.semaphore_slot(2)] == 9
    v.loss_block[3, -1] = 1.0
    assert bytes(buf[L.LOSS_BLOCK + L.LOSS_BLOCK_BYTES - 4:L.LOSS_BLOCK + L.LOSS_BLOCK_BYTES]) == \
        np.float32(1.0).tobytes()
    v.record_final[-1] = 2.0
    end = L.record_final_offset(p) + L.record_final_bytes(p)
    assert bytes(buf[end - 4:end]) == np.float32(2.0).tobytes()
    v.write_marker(L.RECORD)
    assert v.marker_survived(L.RECORD)
    v.record_forward[0, 0] = 0.0
    assert not v.marker_survived(L.RECORD)
    assert v.transfer.size == L.TRANSFER_WINDOW_BYTES
    assert v.doorbell.shape == (1,) and v.error_notifier.shape == (1,)
