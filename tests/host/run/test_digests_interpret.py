"""The per-launch digests of the tiny profile's first update on the interpret backend, and the
bisect over them: the committed golden reproduces; a value perturbed in one launch's output is named as
the first divergent launch with its inputs equal, every later difference as inherited; the default
tolerances across backends pass the same update with every dot product summed in another order
(what a GPU does) and still fail the perturbation.

One backend for the module (its state before the update saved once), three replays of the update
(~10 s each on a 2-core machine).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from tests.support.digest_support import GOLDEN, PROFILE, before_update, replayed
from triton.runtime import interpreter as _interp

from coppelius.cli import bisect as cmd_bisect
from coppelius.results import digests as DG
from coppelius.forensics.bisect import ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL, Rules, bisect
from coppelius.plan.launches import regions as LR
from tools.perturb_digests import perturbation

PERTURBED = "layers.0.mlp.swiglu"       # its first write, [a | b], is read again only by the
AB_READER = "layers.0.mlp_backward.swiglu"   # SwiGLU backward, near the end
ACROSS = Rules(ACROSS_BACKENDS_ATOL, ACROSS_BACKENDS_RTOL)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    d = tmp_path_factory.mktemp("digests")
    be, saved = before_update(d / "stream")
    return be, saved, d


@pytest.fixture(scope="module")
def clean(state):
    be, saved, d = state
    return replayed(be, saved, d / "clean.json")


@pytest.fixture(scope="module")
def perturbed(state):
    be, saved, d = state
    hook = perturbation(PERTURBED)
    doc = replayed(be, saved, d / "perturbed.json", hook)
    assert len(hook.done) == 1
    return doc, hook.done[0]


def _reordered_dot(original):
    """The interpreter's bf16 dot with its K terms summed as two halves, the second half first:
    the same products, another fp32 summation order."""
    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype == np.uint16 and b.data.dtype == np.uint16 and d.data.dtype == np.float32:
            x = (a.data.astype(np.uint32) << np.uint32(16)).view(np.float32)
            y = (b.data.astype(np.uint32) << np.uint32(16)).view(np.float32)
            h = x.shape[-1] // 2
            acc = np.matmul(x[:, h:], y[h:]) + np.matmul(x[:, :h], y[:h])
            acc += d.data
            return _interp.TensorHandle(acc, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)
    return dot


@pytest.fixture(scope="module")
def reordered(state):
    be, saved, d = state
    builder = _interp.InterpreterBuilder
    original = builder.create_dot
    builder.create_dot = _reordered_dot(original)
    try:
        return replayed(be, saved, d / "reordered.json")
    finally:
        builder.create_dot = original


def test_the_committed_golden_reproduces(clean):
    golden = DG.read(GOLDEN)
    rep = bisect(golden, clean, Rules())
    assert rep["same"], rep["first"]
    def shas(doc):                  # every record but the device times
        return [[r["sha256"] for r in x["reads"] + x["writes"] if not r.get("volatile")]
                for x in doc["launches"]]
    assert shas(golden) == shas(clean)
    assert golden["replay_matches_issue"] and golden["backend"] == "interpret"


def test_identical_digests_exit_0_and_the_json_says_so(state, clean, capsys):
    path = str(state[2] / "clean.json")
    args = argparse.Namespace(a=path, b=path, atol=None, rtol=None, across_backends=False,
                              json=True)
    assert cmd_bisect.run(args) == cmd_bisect.EXIT_SAME
    out = json.loads(capsys.readouterr().out)
    assert out["same"] and out["first"] is None and out["launches"] == len(clean["launches"])


def test_a_perturbed_launch_is_named_first_and_its_successors_inherit(clean, perturbed):
    doc, (label, name, element, old, new) = perturbed
    rep = bisect(clean, doc, Rules())
    first = rep["first"]
    assert first["label"] == PERTURBED and first["verdict"] == "diverged"
    assert first["inputs_equal"] and first["inputs_differing"] == []
    region = first["regions"][0]
    assert region["name"] == name == "ab_ptr" and len(first["regions"]) == 1
    assert region["first_index"] == element and region["sampled_differing"] == 1
    assert DG.number(region["a"]) == old and DG.number(region["b"]) == new == 2 * old
    assert region["max_abs"] == abs(old)
    # nothing reads [a | b] until the SwiGLU backward: the launches between stay equal
    labels = [x["label"] for x in clean["launches"]]
    later = rep["later"]
    assert later and later[0]["label"] == AB_READER
    assert all(x["index"] >= labels.index(AB_READER) for x in later)
    assert {x["verdict"] for x in later} == {"inherited"}


def test_the_cli_names_it_and_exits_1(state, perturbed, capsys):
    args = argparse.Namespace(a=str(state[2] / "clean.json"), b=str(state[2] / "perturbed.json"),
                              atol=None, rtol=None, across_backends=False, json=False)
    assert cmd_bisect.run(args) == cmd_bisect.EXIT_DIFFERENT
    text = capsys.readouterr().out
    index = [x["label"] for x in perturbed[0]["launches"]].index(PERTURBED)
    assert f"first divergent launch: #{index} {PERTURBED}" in text
    assert "the kernel diverged" in text
    assert "inheriting" in text


def test_default_tolerances_pass_a_reordered_sum_and_fail_a_perturbation(clean, reordered,
                                                                       perturbed):
    bits = bisect(clean, reordered, Rules())
    assert not bits["same"], "summing in another order changed no bit: the check is void"
    assert bits["differing"] > 10
    tolerant = bisect(clean, reordered, ACROSS)
    assert tolerant["same"], tolerant["first"]
    caught = bisect(clean, perturbed[0], ACROSS)
    assert caught["first"]["label"] == PERTURBED and caught["first"]["inputs_equal"]


def test_every_region_record_is_the_plans(clean):
    """The records follow the plan's regions, in order, the volatile ones flagged."""
    from coppelius.plan import launches
    sub = launches.submissions(PROFILE)[1]
    for launch, rec in zip(sub.launches, clean["launches"]):
        regs = LR.regions(PROFILE, launch)
        assert [r["name"] for r in rec["writes"]] == [r.name for r in regs.writes]
        assert [r["count"] for r in rec["reads"]] == [r.count for r in regs.reads]
        assert [bool(r.get("volatile")) for r in rec["writes"]] == [r.volatile for r in regs.writes]
