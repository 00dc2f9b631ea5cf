"""`coppelius.forensics`, the Python API: docs/API.md's worked example runs against real files, and
each function returns what its command prints (`--json`), refusing as the command does."""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from coppelius import checkpoints, forensics
from coppelius.cli import main
from coppelius.checkpoints.format import CheckpointRefused
from coppelius.plan import profiles
from coppelius.results import digests as DG
from coppelius.results.reader import ResultFileError
from coppelius.staging.errors import UserError
from tests.support.paths import GOLDEN, ROOT
from tests.support.result_synth import synthesize

API_MD = ROOT / "docs" / "API.md"
TINY = profiles.get("tiny")
DIGESTS = GOLDEN / "tiny-digests-c0-s0.json"


def doc_blocks() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", API_MD.read_text(), re.S | re.M)
    assert blocks, "docs/API.md has no ```python block"
    return blocks


def _changed_launch(doc: dict) -> dict:
    """A copy whose first launch after the tenth with an fp32 write has that write's last sampled
    element changed (sample, sum and digest, as a kernel writing one other value leaves them)."""
    doc = copy.deepcopy(doc)
    k = next(i for i, x in enumerate(doc["launches"])
             if i > 10 and any(r["dtype"] == "fp32" for r in x["writes"]))
    rec = next(r for r in doc["launches"][k]["writes"] if r["dtype"] == "fp32")
    old = DG.number(rec["sample"][-1])
    rec["sample"][-1] = float(np.float32(old * 1.5 + 1.0))
    rec["sum"] += DG.number(rec["sample"][-1]) - old
    rec["sha256"] = hashlib.sha256(rec["sha256"].encode()).hexdigest()
    return doc


def example_files(d) -> dict:
    """The example's inputs in folder `d`, by the names the example uses: result files (two of one
    run, one of another seed), a checkpoint, digests files (the golden and one with a launch
    changed)."""
    synthesize(TINY).write(d / "a.bin")
    synthesize(TINY).write(d / "b.bin")
    synthesize(TINY, seed=1).write(d / "c.bin")
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    checkpoints.publish(d / "t.ckpt", TINY, P, P * 2, P * 3, update_count=4)
    changed = _changed_launch(DG.read(DIGESTS))
    DG.write(d / "changed.json", {k: v for k, v in changed.items()
                                  if k not in ("format", "version")})
    return {"result_a": str(d / "a.bin"), "result_b": str(d / "b.bin"),
            "result_c": str(d / "c.bin"), "checkpoint_path": str(d / "t.ckpt"),
            "digests_a": str(DIGESTS), "digests_b": str(d / "changed.json")}


def example_script(files: dict) -> str:
    """docs/API.md's example as a user's script: the paths given first."""
    return "".join(f"{k} = {v!r}\n" for k, v in files.items()) + "\n".join(doc_blocks())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    return example_files(tmp_path_factory.mktemp("api"))


def test_the_docs_example_runs(files, capsys):
    for block in doc_blocks():
        exec(compile(block, str(API_MD), "exec"), dict(files))
    out = capsys.readouterr().out
    assert "tiny completed" in out and "update 4" in out
    assert "first divergent launch #" in out and "diverged" in out
    assert "refused: tolerances must be finite" in out


def test_the_docs_example_runs_from_another_directory(files, tmp_path):
    """As a user's script: a fresh interpreter, elsewhere, the paths given."""
    r = subprocess.run([sys.executable, "-c", example_script(files)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "first divergent launch #" in r.stdout


def test_the_docs_name_every_public_function():
    text = API_MD.read_text()
    for name in forensics.__all__:
        assert f"`{name}" in text, name
        assert inspect.getdoc(getattr(forensics, name)), name


def _cli_json(capsys, *args):
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, json.loads(capsys.readouterr().out)


def test_diff_and_fleet_reports_are_the_commands(files, capsys):
    a, b, c = files["result_a"], files["result_b"], files["result_c"]
    rc, printed = _cli_json(capsys, "diff", a, c, "--across-backends", "--json")
    assert rc == 1
    assert json.loads(forensics.dumps(forensics.compare_results(a, c, across_backends=True))) \
        == printed
    rc, printed = _cli_json(capsys, "diff", a, b, c, "--json")
    assert json.loads(forensics.dumps(forensics.classify_results([a, b, c]))) == printed
    assert forensics.classify_results([a, b])["same"]


def test_bisect_and_inspect_reports_are_the_commands(files, capsys):
    rc, printed = _cli_json(capsys, "bisect", files["digests_a"], files["digests_b"], "--json")
    assert rc == 1
    rep = forensics.compare_digests(files["digests_a"], files["digests_b"])
    assert json.loads(forensics.dumps(rep)) == printed
    rc, printed = _cli_json(capsys, "inspect", files["result_a"], "--json")
    assert rc == 0 and forensics.summarize_run(files["result_a"]) == printed


def test_read_result_every_section(files):
    r = forensics.read_result(files["result_a"])
    assert list(r.sections) == ["forward", "steps", "stat", "loss_block", "final", "semaphores",
                                "error_notifier", "status", "timestamps"]
    assert set(r.records) == {"stat", "semaphores", "error_notifier", "status", "timestamps"}
    assert r.sections["forward"].shape == (3, TINY.vocab)
    assert r.records["status"]["steps_completed"] == r.steps
    assert len(r.records["semaphores"]) == 3
    assert np.allclose(r.step_losses(), r.sections["steps"].mean(axis=1, dtype=np.float64))


def test_read_checkpoint_planes_and_profile(files):
    ck = forensics.read_checkpoint(files["checkpoint_path"])
    assert ck.profile is TINY and ck.update_count == 4
    np.testing.assert_array_equal(ck.M, ck.P * 2)
    payload = (np.concatenate([ck.P, ck.M, ck.V])).tobytes()
    assert ck.payload_sha256 == hashlib.sha256(payload).hexdigest()
    v = forensics.verify_checkpoint(files["checkpoint_path"], "tiny")
    assert v["profile"] == "tiny" and v["payload_sha256"] == ck.payload_sha256


def test_refusals_are_user_errors_with_hints(files, tmp_path):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointRefused, match="0 bytes") as e:
        forensics.read_checkpoint(empty)
    assert e.value.hint
    with pytest.raises(CheckpointRefused, match="this run uses profile 'coppelius'"):
        forensics.read_checkpoint(files["checkpoint_path"], "coppelius")
    with pytest.raises(ResultFileError, match="does not exist"):
        forensics.read_result(tmp_path / "missing.bin")
    for bad in ({"atol": -1.0}, {"rtol": float("nan")}):
        with pytest.raises(UserError, match="tolerances must be finite") as e:
            forensics.compare_results(files["result_a"], files["result_b"], **bad)
        assert e.value.hint
        with pytest.raises(UserError, match="tolerances must be finite"):
            forensics.compare_digests(files["digests_a"], files["digests_b"], **bad)
    with pytest.raises(UserError, match="different computations"):
        other = dict(DG.read(DIGESTS), step=3)
        DG.write(tmp_path / "other.json", {k: v for k, v in other.items()
                                            if k not in ("format", "version")})
        forensics.compare_digests(files["digests_a"], tmp_path / "other.json")
    with pytest.raises(UserError, match="stream"):
        forensics.summarize_run(files["result_a"], stream="maybe")
    with pytest.raises(UserError):
        forensics.classify_results([])
