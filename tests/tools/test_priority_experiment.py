"""The device check's "no stream priority" variant beside the plan's (tools/gpu_check/
experiments.py): the capture options it sets, the model's prediction of both graphs, and the
decision from what the device measures."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import launches
from coppelius.staging import layout as L
from tools.cost import lanes
from tools.cost.per_launch import model
from tools.gpu_check import experiments as X

from tests.support.cost_fixtures import PROD, side_fills_sms


def test_the_variant_turns_only_the_priority_off():
    backend = SimpleNamespace()
    X.set_capture(backend, "no-priority")
    assert vars(backend) == {**X.PLAN_OPTIONS, "priority": False}
    X.set_capture(backend, "plan")
    assert vars(backend) == X.PLAN_OPTIONS and backend.priority


def test_the_model_predicts_both_graphs_from_one_schedule(monkeypatch):
    """The plan's prediction is the schedule under plan/launches/graph.PRIORITY_LANE, the
    variant's the same graph with no priority; pointing the plan at the other lane moves the
    plan's prediction and leaves the variant's."""
    sub = launches.submissions(PROD)[L.SUBMISSION_UPDATE]
    ordered = model(PROD, "update", side_fills_sms(sub, PROD))
    costs = {c.label: c for c in ordered}
    pdl = {c.kernel: True for c in ordered}
    flagged = [dataclasses.replace(c, programmatic=ok) for c, ok in
               zip(ordered, launch_graph.programmatic(sub.launches))]
    pred = X.predicted(PROD, costs, pdl)
    assert pred["no-priority"] == pytest.approx(
        lanes.schedule(sub, flagged, X.SCENARIO, priority_lane=None).makespan_s * 1e6)
    assert pred["plan"] == pytest.approx(
        lanes.schedule(sub, flagged, X.SCENARIO).makespan_s * 1e6)
    other = launches.MAIN_LANE if launch_graph.PRIORITY_LANE != launches.MAIN_LANE \
        else launches.SIDE_LANE
    monkeypatch.setattr(launch_graph, "PRIORITY_LANE", other)
    flipped = X.predicted(PROD, costs, pdl)
    assert flipped["no-priority"] == pred["no-priority"] and flipped["plan"] != pred["plan"]


def _rows(plan_us, alt_us, note=None, predicted=(1950.0, 1957.0)):
    (a, va), (b, vb) = X.PAIRS[X.PRIORITY]
    return [{"name": X.PRIORITY, "variant": a, "capture": va, "graph_us": plan_us,
             "predicted_us": predicted[0], "programmatic_edges": 40, "priority_note": note},
            {"name": X.PRIORITY, "variant": b, "capture": vb, "graph_us": alt_us,
             "predicted_us": predicted[1], "programmatic_edges": 40, "priority_note": None}]


@pytest.mark.parametrize("plan_us,alt_us,keep", [(1900.0, 2000.0, 0), (2000.0, 1900.0, 1),
                                                 (1950.0, 1960.0, 0)])
def test_the_decision_keeps_the_faster_capture_and_shows_the_models_delta(plan_us, alt_us, keep):
    d = {x["name"]: x for x in X.decide(_rows(plan_us, alt_us))}[X.PRIORITY]
    assert d["keep"] == X.PAIRS[X.PRIORITY][keep][0]
    assert d["delta_us"] == pytest.approx(plan_us - alt_us)
    assert d["predicted_delta_us"] == pytest.approx(-7.0)


def test_a_device_without_priorities_decides_nothing():
    note = "the device has no stream priorities (range 0..0): every lane at the default"
    d = {x["name"]: x for x in X.decide(_rows(1900.0, 2000.0, note=note))}[X.PRIORITY]
    assert d["keep"] is None and d["why"] == note
