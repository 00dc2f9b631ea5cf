"""A soak on the interpret backend (tiny, one step, K = 3 repetitions from one saved state): with a
value perturbed in repetition 1 only, `coppelius soak` names it as a transient fault by launch and
region (repetition 2 matches the first); without, no transient fault.  And the refusals (a soak
without digests; `--device` other than 0 on the interpreter)."""
from __future__ import annotations

import pytest

from coppelius.cli import main
from coppelius.forensics.bisect import soak
from coppelius.plan import profiles
from coppelius.results import digests
from coppelius.run.loop import Request, RunRefused, make_backend, run as run_loop
from tools.perturb_digests import perturbation

PERTURBED = "layers.0.mlp.swiglu"


def test_a_transient_fault_is_named_by_repetition_launch_and_region(tmp_path, capsys):
    pytest.importorskip("triton", reason="the interpret backend needs Triton")
    hook = perturbation(PERTURBED)
    path = tmp_path / "soak.json"
    (tmp_path / "tiny.ckpt").write_bytes(b"")
    summary = run_loop(Request(profile=profiles.get("tiny"), backend="interpret", steps=1,
                               directory=tmp_path / "run", checkpoint=tmp_path / "tiny.ckpt",
                               result=tmp_path / "r.bin", digests=path, soak=3,
                               digest_perturb=hook, digest_perturb_repetition=1))
    assert summary.outcome == 0 and len(hook.done) == 1
    doc = digests.read(path)
    assert doc["replay_matches_issue"] and doc["soak"]["repetitions"] == 3
    rep = soak(doc, path)
    assert not rep["same"] and rep["verdict"] == "transient fault in 1 of 3 repetitions"
    (fault,) = rep["transient"]
    assert fault["repetition"] == 1 and fault["label"] == PERTURBED
    assert fault["verdict"] == "diverged" and fault["regions"][0]["name"] == hook.done[0][1]
    assert main(["soak", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"repetition 1: transient fault at launch #{fault['launch']} {PERTURBED}" in out
    assert hook.done[0][1] in out
    clean = dict(doc, soak=dict(doc["soak"], differing=[]))
    assert soak(clean)["verdict"] == "no transient fault"


def test_soak_refusals(tmp_path):
    with pytest.raises(RunRefused, match="--soak 3 needs --digests"):
        run_loop(Request(profile=profiles.get("tiny"), backend="interpret", steps=1,
                         directory=tmp_path, soak=3))
    with pytest.raises(digests.DigestsError, match="no soak"):
        soak({"profile": "tiny"}, "x.json")


def test_device_names_a_gpu_the_interpreter_refuses_another_than_0():
    with pytest.raises(RunRefused, match="--device 1 names a GPU; the interpret backend"):
        make_backend("interpret", profiles.get("tiny"), 1)
