"""`coppelius diff`: bit-identical, first difference, tolerances, volatile fields, exits;
--across-backends; fleet classes."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from coppelius import cli
from coppelius.forensics import diff
from coppelius.results import reader as RF
from coppelius.plan import profiles as P
from coppelius.staging import layout as L
from coppelius.staging import records as R

from tests.support.result_synth import synthesize


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
    for f in diff.TIME_FIELDS["timestamps"]:
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
    rep = diff.compare(RF.read(a), RF.read(b))
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


# ------------------------------------------------------------------ --across-backends
def _patched(syn, **status):
    """A copy of `syn` with status fields replaced (the other parts shared)."""
    st = R.STATUS_BLOCK.unpack(syn.status)
    st.update(status)
    return replace(syn, status=R.STATUS_BLOCK.pack(**st))


INTERPRET = dict(backend=R.BACKEND_INTERPRET, device_name="cpu (triton interpreter)",
                 compute_capability=0, driver_version=0)
CUDA = dict(backend=R.BACKEND_CUDA, device_name="NVIDIA H200", compute_capability=90,
            driver_version=13000, checkpoint_sha256=np.arange(32, dtype=np.uint8))


def test_across_backends_defaults_are_verify_budgets():
    from coppelius.forensics import tolerances as V
    assert diff.ACROSS_BACKENDS_ATOL == V.ROW_ATOL == V.LOGIT_ATOL      # the comment's claim
    assert diff.ACROSS_BACKENDS_RTOL == 2.0 ** -7                       # one bf16 ulp, relative


def _backend_pair(tmp_path):
    """An interpret result and a "cuda" copy: identity patched, numbers moved within tolerance."""
    syn = _patched(synthesize(P.get("tiny"), seed=11), **INTERPRET)
    a = tmp_path / "interpret.res"
    syn.write(a)
    other = _patched(syn, **CUDA)
    stat = R.STAT_RECORD.unpack(other.stat)
    stat["payload_sha256"] = np.full(32, 7, np.uint8)         # continued from its own checkpoint
    other = replace(other, stat=R.STAT_RECORD.pack(**stat))
    rng = np.random.default_rng(5)
    fwd = np.frombuffer(syn.forward, "<f4")
    other.forward = (fwd * (1 + rng.uniform(-1e-3, 1e-3, fwd.shape))).astype("<f4").tobytes()
    other.windows = syn.windows + rng.uniform(-1e-3, 1e-3, syn.windows.shape).astype("<f4")
    return syn, other, a, tmp_path / "cuda.res"


def test_across_backends_identity_apart_numbers_within_tolerance(tmp_path, capsys):
    _, other, a, b = _backend_pair(tmp_path)
    other.write(b)
    rc, rep = _diff(capsys, a, b)                   # bits: every identity field counts
    assert rc == 1
    status = next(s for s in rep["sections"] if s["section"] == "status")
    assert {"status.backend", "status.device_name", "status.compute_capability",
            "status.checkpoint_sha256"} <= set(status["fields"])
    rc, rep = _diff(capsys, a, b, "--across-backends")
    assert rc == 0, rep["first"]
    assert rep["verdict"] == "within tolerance"
    assert (rep["atol"], rep["rtol"]) == (diff.ACROSS_BACKENDS_ATOL, diff.ACROSS_BACKENDS_RTOL)
    assert set(rep["identity_fields"]) == {"status.backend", "status.device_name",
                                           "status.compute_capability",
                                           "status.checkpoint_sha256", "stat.payload_sha256"}
    assert "status.driver_version" in rep["environment_fields"]
    ident = {r["field"]: r for r in rep["identity"]}
    assert (ident["backend"]["a"], ident["backend"]["b"]) == ("interpret", "cuda")
    assert (ident["ptx_target"]["a"], ident["ptx_target"]["b"]) == (None, "sm_90a")
    assert ident["device_name"]["differs"] and not ident["ptx_target"]["a"]
    steps = next(s for s in rep["sections"] if s["section"] == "steps")
    assert steps["differing"] > 0 and steps["beyond_tolerance"] == 0
    assert cli.main(["diff", str(a), str(b), "--across-backends"]) == 0
    out = capsys.readouterr().out
    assert "identity (listed apart, never counted)" in out and "NVIDIA H200" in out
    assert "sm_90a" in out and "cpu (triton interpreter)" in out
    # explicit tolerances win over the defaults: bits again, but identity still apart
    rc, rep = _diff(capsys, a, b, "--across-backends", "--atol", "0", "--rtol", "0")
    assert rc == 1 and rep["first"]["section"] == "forward"
    assert "status.backend" in rep["identity_fields"]


def test_across_backends_flipped_loss_bit_names_step_and_row(tmp_path, capsys):
    _, other, a, b = _backend_pair(tmp_path)
    other.windows[5, 777] = -other.windows[5, 777]           # sign bit: far beyond tolerance
    other.write(b)
    rc, rep = _diff(capsys, a, b, "--across-backends")
    assert rc == 1 and rep["verdict"] == "different"
    # the forward part differs first, within tolerance: the first *beyond* it is named
    assert rep["first"]["section"] == "steps", rep["first"]
    assert (rep["first"]["step"], rep["first"]["row"]) == (5, 777)
    assert rep["first"]["within_tolerance"] is False
    steps = next(s for s in rep["sections"] if s["section"] == "steps")
    assert steps["beyond_tolerance"] == 1
    assert cli.main(["diff", str(a), str(b), "--across-backends"]) == 1
    assert "first difference: section steps, step 5, row 777" in capsys.readouterr().out


def test_across_backends_predictions_near_tie(tmp_path, capsys):
    syn, other, a, b = _backend_pair(tmp_path)
    final = np.frombuffer(syn.final, "<f4").copy()                 # (V,) row 1023 logits
    preds = np.asarray(R.STATUS_BLOCK.unpack(syn.status)["predictions"]).copy()
    top = int(final.argmax())
    rival = (top + 1) % final.size
    final[rival] = final[top] - np.float32(1e-3)                   # a near tie in A
    syn = replace(syn, final=final.tobytes())
    preds[2] = (top, 1)
    syn = _patched(syn, predictions=preds)
    syn.write(a, overwrite=True)
    fb = final.copy()
    fb[rival] = final[top] + np.float32(1e-3)                      # B breaks it the other way
    p2 = preds.copy()
    p2[2] = (rival, 1)
    other = _patched(replace(other, final=fb.tobytes()), predictions=p2)
    other.write(b)
    rc, rep = _diff(capsys, a, b, "--across-backends")
    pred = next(s for s in rep["sections"] if s["section"] == "predictions")
    assert rc == 0 and pred["differing"] == 1 and pred["beyond_tolerance"] == 0, pred
    assert "near tie" in pred["first"]["where"]
    rc, rep = _diff(capsys, a, b)                                  # bits: it counts
    assert rc == 1 and any(s["section"] == "predictions" and s["beyond_tolerance"] == 1
                           for s in rep["sections"])
    # another row's token cannot be judged (its logits are not in the file): it counts
    p3 = p2.copy()
    p3[0, 0] = (p3[0, 0] + 1) % final.size
    _patched(other, predictions=p3).write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b, "--across-backends")
    assert rc == 1 and rep["first"]["section"] == "predictions" and rep["first"]["row"] == 255


# ------------------------------------------------------------------------ fleet
def _fleet_file(path, syn, k: int) -> None:
    """`syn` written as node k would: the same bits, its own times (wall time, host clocks)."""
    ts = np.frombuffer(syn.timestamps, R.TIMESTAMP_ENTRY.dtype).copy()
    for f in diff.TIME_FIELDS["timestamps"]:
        ts[f] += 1000 * k
    st = R.STATUS_BLOCK.unpack(syn.status)
    st["wall_ns"] += k
    replace(syn, timestamps=ts.tobytes(), status=R.STATUS_BLOCK.pack(**st)).write(path)


def _fleet(capsys, *paths, extra=()):
    rc = cli.main(["diff", *map(str, paths), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_fleet_all_same_one_class(tmp_path, capsys):
    syn = synthesize(P.get("tiny"), seed=21)
    paths = [tmp_path / f"node{k}.bin" for k in range(4)]
    for k, p in enumerate(paths):
        _fleet_file(p, syn, k)
    rc, rep = _fleet(capsys, *paths)
    assert rc == 0 and rep["same"] and len(rep["classes"]) == 1
    (cls,) = rep["classes"]
    assert cls["members"] == [str(p) for p in paths] and cls["first_difference"] is None
    assert [f["verdict"] for f in cls["member_details"]] == \
        ["first member"] + ["identical except time-dependent and environment fields"] * 3
    assert cli.main(["diff", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "4 result files: all 4 in one class" in out and "NVIDIA H200" in out


def test_fleet_three_classes_in_argument_order(tmp_path, capsys):
    syn = synthesize(P.get("tiny"), seed=22)
    p = {name: tmp_path / f"{name}.bin" for name in ("a", "b", "flip", "c0", "d")}
    _fleet_file(p["a"], syn, 0)
    _fleet_file(p["b"], syn, 1)
    flipped = replace(syn, windows=syn.windows.copy())
    flipped.windows[6, 321] = np.nextafter(flipped.windows[6, 321], np.float32(0))
    _fleet_file(p["flip"], flipped, 2)
    synthesize(P.get("tiny"), seed=23, c0=8).write(p["c0"])       # a continuation: another c0
    _fleet_file(p["d"], syn, 3)
    order = [p["a"], p["flip"], p["b"], p["c0"], p["d"]]
    rc, rep = _fleet(capsys, *order)
    assert rc == 1 and not rep["same"] and rep["verdict"] == "3 classes"
    assert set(rep) == {"files", "across_backends", "atol", "rtol", "same", "verdict", "classes"}
    assert rep["files"] == [str(x) for x in order]
    assert [c["class"] for c in rep["classes"]] == [1, 2, 3]
    assert [c["members"] for c in rep["classes"]] == \
        [[str(p["a"]), str(p["b"]), str(p["d"])], [str(p["flip"])], [str(p["c0"])]]
    one, two, three = rep["classes"]
    assert one["first_difference"] is None
    d = two["first_difference"]
    assert (d["section"], d["step"], d["row"]) == ("steps", 6, 321)
    assert d["max_abs"] > 0 and 0 < d["max_rel"] < 1e-6
    assert three["first_difference"]["section"] == "forward"
    assert [f["c0"] for f in three["member_details"]] == [8]
    for cls in rep["classes"]:                # every member's identity, for the table
        for f in cls["member_details"]:
            assert {"path", "device_name", "compute_capability", "driver_version", "ptx_target",
                    "backend", "outcome", "c0"} <= set(f)
    # a tolerance that covers the one-ulp flip merges class 2 into class 1
    rc, rep = _fleet(capsys, *order, extra=("--rtol", "1e-6"))
    assert rc == 1 and [len(c["members"]) for c in rep["classes"]] == [4, 1]
    assert cli.main(["diff", *map(str, order)]) == 1
    out = capsys.readouterr().out
    assert "5 result files: 3 classes" in out
    assert "steps: step 6, row 321" in out and f"class 2: {p['flip']}" in out


def test_fleet_membership_against_each_class_first_member(tmp_path, capsys):
    """B is within tolerance of A and of C, A and C are not: C opens a class even though it
    matches a member of class 1 — membership is tested against the first member only."""
    syn = synthesize(P.get("tiny"), seed=24)
    paths = []
    for k, shift in enumerate((0.0, 0.006, 0.012)):
        path = tmp_path / f"n{k}.bin"
        replace(syn, windows=syn.windows + np.float32(shift)).write(path)
        paths.append(path)
    rc, rep = _fleet(capsys, *paths, extra=("--atol", "0.008"))
    assert rc == 1 and [c["members"] for c in rep["classes"]] == \
        [[str(paths[0]), str(paths[1])], [str(paths[2])]]
    rc, rep = _fleet(capsys, paths[1], paths[0], paths[2], extra=("--atol", "0.008"))
    assert rc == 0 and len(rep["classes"]) == 1               # B first: everything matches it


def test_fleet_unreadable_exit_2_names_it(tmp_path, capsys):
    syn = synthesize(P.get("tiny"), seed=25)
    good = [tmp_path / "n0.bin", tmp_path / "n1.bin"]
    for k, p in enumerate(good):
        _fleet_file(p, syn, k)
    cut = tmp_path / "n2-killed.bin"
    cut.write_bytes(good[0].read_bytes()[:-7])
    missing = tmp_path / "missing.bin"
    for argv, bad in (([*good, cut], cut), ([good[0], cut, good[1]], cut),
                      ([*good, missing], missing)):
        assert cli.main(["diff", *map(str, argv)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"{bad}: " in err or f"result file {bad} does not exist" in err, err


def test_two_files_json_carries_the_classes(tmp_path, capsys):
    syn, a, b = _pair(tmp_path, seed=26)
    rc, rep = _diff(capsys, a, b)
    assert rc == 0 and [c["members"] for c in rep["classes"]] == [[str(a), str(b)]]
    syn.windows[2, 2] += 1
    syn.write(b, overwrite=True)
    rc, rep = _diff(capsys, a, b)
    assert rc == 1 and [c["members"] for c in rep["classes"]] == [[str(a)], [str(b)]]
    assert rep["classes"][1]["first_difference"]["step"] == 2
