"""The digests file and the bisect over it, without running a kernel: the committed golden
(tests/golden/tiny-digests-c0-s0.json) read, rewritten and mutated.  A truncated, altered or
other-version file is refused by name with no traceback; a file of another plan, profile or step
cannot be compared (exit 2, the field named); a difference in the last element of a region is
found; identical files exit 0; the fingerprint's parts; `coppelius diff` of differing results ends
with the bisect to run next."""
from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.support.digest_support import GOLDEN

from coppelius.results import digests as DG
from coppelius.cli import main
from coppelius.cli.render_diff import bisect_hint, digest_step
from coppelius.forensics.bisect import ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL, Rules, bisect
from coppelius.plan.launches import regions as LR



@pytest.fixture(scope="module")
def golden() -> dict:
    return DG.read(GOLDEN)


def cli(capsys, *args) -> subprocess.CompletedProcess:
    """`coppelius ARGS` in this process (coppelius.cli.main: its one-line refusals, its exit codes)."""
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def rewritten(doc: dict, path: Path) -> Path:
    """`doc` (a changed copy) written as a file of its own: a new content digest."""
    DG.write(path, {k: v for k, v in doc.items() if k not in ("format", "version")})
    return path


def test_the_golden_reads_and_rewrites_to_the_same_content(golden, tmp_path):
    again = DG.read(rewritten(copy.deepcopy(golden), tmp_path / "again.json"))
    assert again == golden
    assert golden["launch_count"] == len(golden["launches"]) == 45
    assert (tmp_path / "again.json").stat().st_size < 15_000 * golden["launch_count"]


def test_identical_files_exit_0_and_the_same_file_bisects_clean(capsys):
    r = cli(capsys, "bisect", GOLDEN, GOLDEN)
    assert r.returncode == 0, r.stderr
    assert "no launch differs" in r.stdout and "45 launches" in r.stdout


def _altered(text: str) -> str:
    """One hex digit of the first region digest inside the launches flipped."""
    at = text.index('"sha256":"', text.index('"launches"')) + len('"sha256":"')
    return text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:]


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t[:len(t) // 2].encode(), "not a complete JSON document"),
    (lambda t: _altered(t).encode(), "content digest differs"),
    (lambda t: t.replace('"version": 1', '"version": 2', 1).encode(), "digests version 2"),
    (lambda t: t.replace('"format": "coppelius-digests"', '"format": "other"', 1).encode(),
     "format is 'other'"),
    (lambda t: b"\xff" + t.encode(), "not UTF-8 text"),
    (lambda t: t.replace('"sum":', '"sum":NaN,"x":', 1).encode(), "holds NaN, not JSON"),
])
def test_a_bad_file_is_refused_by_name_without_a_traceback(tmp_path, capsys, mutate, message):
    text = GOLDEN.read_text()
    bad = tmp_path / "bad.json"
    bad.write_bytes(mutate(text))
    with pytest.raises(DG.DigestsError, match=message):
        DG.read(bad)
    r = cli(capsys, "bisect", GOLDEN, bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("coppelius bisect: ") and "hint:" in r.stderr


def test_a_missing_field_and_a_wrong_sample_are_named(golden, tmp_path):
    doc = copy.deepcopy(golden)
    del doc["launches"][3]["writes"][0]["sha256"]
    with pytest.raises(DG.DigestsError, match=r"launch 3 \(.*\) writes\[0\] has no field 'sha256'"):
        DG.read(rewritten(doc, tmp_path / "a.json"))
    doc = copy.deepcopy(golden)
    doc["launches"][5]["writes"][0]["sample_index"][-1] -= 1
    with pytest.raises(DG.DigestsError, match="not the fixed strided sample"):
        DG.read(rewritten(doc, tmp_path / "b.json"))


@pytest.mark.parametrize("field, value", [("profile", "coppelius"), ("plan", "0" * 64),
                                          ("step", 3), ("c0", 8)])
def test_files_of_another_computation_cannot_be_compared(golden, tmp_path, capsys, field,
                                                        value):
    doc = copy.deepcopy(golden)
    doc[field] = value
    other = rewritten(doc, tmp_path / "other.json")
    r = cli(capsys, "bisect", GOLDEN, other)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"describe different computations: {field}" in r.stderr


def _changed_last_element(golden: dict, launch: int) -> dict:
    """A copy whose launch `launch` has its first write's last element changed (sample, stats
    and digest, as a kernel writing one other value would leave them)."""
    doc = copy.deepcopy(golden)
    rec = next(r for r in doc["launches"][launch]["writes"] if r["dtype"] == "fp32")
    assert rec["sample_index"][-1] == rec["count"] - 1
    old = DG.number(rec["sample"][-1])
    rec["sample"][-1] = float(np.float32(old * 1.5 + 1.0))
    rec["sum"] += DG.number(rec["sample"][-1]) - old
    rec["sha256"] = hashlib.sha256(rec["sha256"].encode()).hexdigest()
    return doc


def test_a_difference_in_the_last_element_is_found(golden):
    k = next(i for i, x in enumerate(golden["launches"])
             if any(r["dtype"] == "fp32" for r in x["writes"]) and i > 10)
    rep = bisect(golden, _changed_last_element(golden, k), Rules())
    first = rep["first"]
    assert first["index"] == k and first["verdict"] == "diverged" and first["inputs_equal"]
    region = first["regions"][0]
    assert region["first_index"] == region["count"] - 1 and region["sampled_differing"] == 1
    # the same under tolerances: one and a half times the value plus one is no rounding
    rules = Rules(ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL)
    assert bisect(golden, _changed_last_element(golden, k), rules)["first"]["index"] == k


def test_within_the_tolerances_a_bf16_ulp_is_equal():
    rec = {"name": "x", "space": "h16", "offset": 0, "dtype": "bf16", "count": 3, "sha256": "a",
           "sum": 3.0, "abs_sum": 3.0, "sum_sq": 3.0, "max_abs": 1.0, "nan": 0, "inf": 0,
           "sample_index": [0, 1, 2], "sample": [1.0, 1.0, 1.0]}
    ulp = dict(rec, sha256="b", sample=[1.0, 1.0 + 2.0 ** -7, 1.0], sum=3.0 + 2.0 ** -7)
    from coppelius.forensics.bisect import region_diff
    rules = Rules(ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL)
    assert region_diff(rec, ulp, rules) is None
    assert region_diff(rec, ulp, Rules())["first_index"] == 1
    far = dict(ulp, sample=[1.0, 1.0 + 2.0 ** -4, 1.0])
    assert region_diff(rec, far, rules)["beyond"] == 1
    nan = dict(rec, sha256="c", nan=1, sample=[1.0, "nan", 1.0])
    assert region_diff(rec, nan, rules)["stats_beyond"] == ["nan"]


def test_the_fingerprint_of_a_strided_bf16_region():
    r = LR.Region("x", "h16", 4, 3, "bf16", repeat=2, stride=5)
    vals = np.array([1.0, -2.0, np.nan, 0.5, np.inf, 3.0], np.float32)
    raw = (vals.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.uint8)
    rec = DG.summary(r, raw)
    assert (rec["count"], rec["nan"], rec["inf"]) == (6, 1, 1)
    assert (rec["sum"], rec["abs_sum"], rec["max_abs"]) == (2.5, 6.5, 3.0)
    assert rec["sample"] == [1.0, -2.0, "nan", 0.5, "inf", 3.0]
    assert rec["sha256"] == hashlib.sha256(raw.tobytes()).hexdigest()
    assert DG.sample_indices(10 ** 6)[[0, -1]].tolist() == [0, 10 ** 6 - 1]
    assert DG.sample_indices(10 ** 6).size == DG.SAMPLE == len(set(DG.sample_indices(10 ** 6)))


def test_diff_ends_with_the_bisect_to_run_next():
    rep = {"same": False, "across_backends": True, "first": {"section": "steps", "step": 3},
           "a": {"profile": "tiny", "steps": 8, "c0": 0}, "b": {"profile": "tiny", "steps": 8, "c0": 0}}
    assert digest_step(rep) == 2
    hint = bisect_hint(rep)
    assert "--digest-step 2" in hint and "--steps 3" in hint
    assert hint.endswith("`coppelius bisect A.json B.json --across-backends`")
    assert digest_step(dict(rep, first={"section": "forward"})) == 0
    assert digest_step(dict(rep, first={"section": "final"})) == 7


def test_the_digests_flags_are_refused_before_any_work(tmp_path, capsys):
    r = cli(capsys, "run", "--profile", "tiny", "--backend", "interpret", "--digest-step", "1",
            "--directory", tmp_path)
    assert r.returncode == 2 and "--digest-step needs --digests FILE" in r.stderr
    (tmp_path / "c.ckpt").write_bytes(b"")
    r = cli(capsys, "run", "--profile", "tiny", "--backend", "interpret", "--steps", "2",
            "--digest-step", "2", "--digests", tmp_path / "d.json", "--checkpoint",
            tmp_path / "c.ckpt", "--directory", tmp_path)
    assert r.returncode == 2 and "--digest-step 2 is outside this run's steps 0..1" in r.stderr
    assert not (tmp_path / "d.json").exists() and not list(tmp_path.glob("*.bin"))
    earlier = {"format": DG.FORMAT}                     # an earlier digests file of its own
    (tmp_path / "d.json").write_text(json.dumps(earlier))
    r = cli(capsys, "run", "--profile", "tiny", "--backend", "interpret", "--steps", "1",
            "--digests", tmp_path / "d.json", "--checkpoint", tmp_path / "c.ckpt",
            "--directory", tmp_path)
    assert r.returncode == 2 and "digests file" in r.stderr and "--overwrite" in r.stderr
    assert json.loads((tmp_path / "d.json").read_text()) == earlier
