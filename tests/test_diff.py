"""Issue 6: `coppelius diff` — bit-identical, first difference, tolerances, volatile fields, exits."""
from __future__ import annotations

import json

import numpy as np
import pytest

from host import cli
from host import cmd_diff as D
from host import result_file as RF
from plan import profiles as P
from staging import layout as L
from staging import records as R

from result_synth import synthesize


def _pair(tmp_path, name="tiny", **kw):
    a, b = tmp_path / "a.res", tmp_path / "b.res"
    syn = synthesize(P.get(name), **kw)
    syn.write(a, overwrite=True)
    syn.write(b, overwrite=True)
    return syn, a, b


def _flip(path, offset: int, mask: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _diff(capsys, a, b, *extra):
    rc = cli.main(["diff", str(a), str(b), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_bit_identical(tmp_path, capsys):
    _, a, b = _pair(tmp_path)
    rc, rep = _diff(capsys, a, b)
    assert rc == 0 and rep["verdict"] == "bit-identical" and rep["first"] is None
    assert cli.main(["diff", str(a), str(b)]) == 0
    assert "bit-identical" in capsys.readouterr().out


def test_flipped_bit_in_step_7321_production_size(tmp_path, capsys):
    _, a, b = _pair(tmp_path, "coppelius", seed=9)
    rf = RF.read(b)
    row = 611
    _flip(b, rf.offsets["steps"][0] + (7321 * 1024 + row) * 4 + 1, 0x04)   # a mantissa bit
    rc, rep = _diff(capsys, a, b)
    assert rc == 1 and rep["verdict"] == "different"
    assert rep["first"]["section"] == "steps"
    assert (rep["first"]["step"], rep["first"]["row"]) == (7321, row)
    steps = next(s for s in rep["sections"] if s["section"] == "steps")
    assert steps["differing"] == 1 and steps["max_abs"] > 0
    assert all(s["differing"] == 0 for s in rep["sections"] if s["section"] != "steps")
    assert cli.main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "step 7,321, row 611" in out and "different" in out


def test_last_element_of_each_float_section(tmp_path, capsys):
    syn, a, b = _pair(tmp_path)
    rf = RF.read(a)
    expect = {"forward": {"row": 1023, "column": 511}, "steps": {"step": 7, "row": 1023},
              "loss_block": {"window": 3, "word": 1023}, "final": {"column": 511}}
    for section, loc in expect.items():
        syn.write(b, overwrite=True)
        off, size = rf.offsets[section]
        _flip(b, off + size - 1, 0x80)                    # sign bit of the last word
        rc, rep = _diff(capsys, a, b)
        assert rc == 1 and rep["first"]["section"] == section, rep["first"]
        assert {k: rep["first"][k] for k in loc} == loc, rep["first"]
        sect = next(s for s in rep["sections"] if s["section"] == section)
        assert sect["differing"] == 1


def test_tolerances(tmp_path, capsys):
    syn, a, b = _pair(tmp_path, seed=3)
    syn.windows[4, 100] = np.nextafter(syn.windows[4, 100], np.float32(np.inf))
    syn.write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b)
    assert rc == 1 and (rep["first"]["step"], rep["first"]["row"]) == (4, 100)
    rc, rep = _diff(capsys, a, b, "--rtol", "1e-6")
    assert rc == 0 and rep["verdict"] == "within tolerance"
    assert rep["first"]["within_tolerance"] is True
    syn.windows[6, 3] += 0.01
    syn.write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b, "--rtol", "1e-6")
    assert rc == 1 and (rep["first"]["step"], rep["first"]["row"]) == (6, 3)
    rc, rep = _diff(capsys, a, b, "--atol", "0.1")
    assert rc == 0
    assert cli.main(["diff", str(a), str(b), "--atol", "-1"]) == 2


def test_nan_with_the_same_bits_is_equal(tmp_path, capsys):
    syn = synthesize(P.get("tiny"))
    syn.windows[1, 7] = np.nan
    a, b = tmp_path / "a", tmp_path / "b"
    syn.write(a)
    syn.write(b)
    rc, rep = _diff(capsys, a, b)
    assert rc == 0 and rep["verdict"] == "bit-identical"
    syn.windows[1, 7] = 1.0
    syn.write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b, "--atol", "1e9")
    assert rc == 1 and rep["first"]["step"] == 1       # NaN vs a number is never within tolerance


def test_time_and_environment_fields_never_count(tmp_path, capsys):
    syn, a, _ = _pair(tmp_path, seed=4)
    other = synthesize(P.get("tiny"), seed=4)
    ts = np.frombuffer(other.timestamps, R.TIMESTAMP_ENTRY.dtype).copy()
    for f in D.TIME_FIELDS["timestamps"]:
        ts[f] += 12345
    other.timestamps = ts.tobytes()
    st = R.STATUS_BLOCK.unpack(other.status)
    st.update(wall_ns=st["wall_ns"] + 1, driver_version=13000)
    other.status = R.STATUS_BLOCK.pack(**st)
    stat = R.STAT_RECORD.unpack(other.stat)
    stat.update(st_ino=99, st_dev=7, st_mtime_ns=5, st_atime_ns=6, st_ctime_ns=7)
    other.stat = R.STAT_RECORD.pack(**stat)
    sems = np.frombuffer(other.semaphores, R.SEMAPHORE_SLOT.dtype).copy()
    sems["final_timestamp"] += 1
    other.semaphores = sems.tobytes()
    b = tmp_path / "b2.res"
    other.write(b)
    rc, rep = _diff(capsys, a, b)
    assert rc == 0, rep
    assert rep["verdict"] == "identical except time-dependent and environment fields"
    assert "status.wall_ns" in rep["time_fields"] and "stat.st_mtime_ns" in rep["time_fields"]
    assert any(f.startswith("timestamps.host_issue_ns") for f in rep["time_fields"])
    assert set(rep["environment_fields"]) == {"stat.st_ino", "stat.st_dev", "status.driver_version"}
    # a deterministic field in the same records does count: the step index of entry 3
    ts["step"][3] += 1
    other.timestamps = ts.tobytes()
    other.write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b)
    assert rc == 1 and rep["first"]["section"] == "timestamps"
    assert rep["first"]["entry"] == 3 and rep["first"]["field"] == "step"


def test_different_runs(tmp_path, capsys):
    _, a, _ = _pair(tmp_path)
    cut = tmp_path / "cut.res"
    synthesize(P.get("tiny"), outcome=R.OUTCOME_INTERRUPTED, steps=5).write(cut)
    rc, rep = _diff(capsys, a, cut)
    assert rc == 1 and "step windows differ: A 8, B 5" in rep["structure"]
    big = tmp_path / "big.res"
    synthesize(P.get("coppelius"), steps=2).write(big)
    rc, rep = _diff(capsys, a, big)
    assert rc == 1 and rep["structure"] == ["profiles differ: A tiny, B coppelius"]


def test_shorter_run_with_the_same_prefix(tmp_path, capsys):
    syn = synthesize(P.get("tiny"), seed=8)
    a, b = tmp_path / "a", tmp_path / "b"
    syn.write(a)
    syn.windows = syn.windows[:6]
    st = R.STATUS_BLOCK.unpack(syn.status)
    st.update(steps_completed=6, gp_put=8)
    syn.status = R.STATUS_BLOCK.pack(**st)
    syn.timestamps = syn.timestamps[:8 * L.TIMESTAMP_ENTRY_BYTES]
    syn.write(b)
    rep = D.compare(RF.read(a), RF.read(b))
    steps = next(s for s in rep["sections"] if s["section"] == "steps")
    assert steps["differing"] == 0 and not rep["same"]
    assert (rep["first"]["section"], rep["first"]["step"]) == ("steps", 6)
    assert "only A has it" in rep["first"]["where"]


def test_unreadable_exit_2(tmp_path, capsys):
    _, a, _ = _pair(tmp_path)
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a result file")
    assert cli.main(["diff", str(a), str(junk)]) == 2
    assert "shorter than any result file" in capsys.readouterr().err
