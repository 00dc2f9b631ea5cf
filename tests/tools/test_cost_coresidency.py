"""The cost model honest about co-residency and its inputs — CTAs on one SM
share its throughput (two identical ones take ~2× one's K loop), a grid released together runs
in step (its epilogues are not hidden under its K loops, and they ask HBM together), the tensor
bound divides by the SMs a grid holds, the scenarios' moved inputs, and the sensitivity table."""
from __future__ import annotations

import json
import math

import pytest

from coppelius.plan import launches, profiles
from coppelius.plan.buffers import buffers
from tools.cost import inputs as ci
from tools.cost import lanes
from tools.cost.bounds import PerProgram, bounds, cta_phases, held_sms, step_parts
from tools.cost.kernel_stats import KernelStats
from tools.cost.per_launch import cost, model
from tools.cost.report import report
from tools.cost.sensitivity import BRACKETED, graph_us
from tools.cost.sm_sim import Grid, Phase, Sim, alone, footprint

from tests.support.cost_fixtures import PROD, UPDATE, US, fake_stats

HALF = footprint(230, 128, 98304)    # the weight gradient's CTA: two fill an SM
INF = float("inf")


@pytest.fixture(scope="module")
def mlp_dw():
    """Layer 0's MLP weight gradient at the committed kernel's registers (230 × 128 threads,
    2 per SM): 130 programs of 2 tiles, each a K loop of 32 trips, then 2 AdamW epilogues."""
    launch = UPDATE["layers.0.mlp_backward.dW+adamw"]
    return cost(launch, buffers(PROD), {launch.kernel: KernelStats(230, 98304, 128)})


def _one(c, s="central"):
    """The first program's phases (its loop, its prologue/epilogues), bytes included."""
    return cta_phases(c.work, s)[0]


def test_a_phase_asks_the_sm_its_throughput_over_its_time(mlp_dw):
    loop, tail = _one(mlp_dw)
    g = mlp_dw.work.programs[0]
    thr, lat = step_parts(g.step, "central")
    # a trip: 2·128·128·64 FLOP at 640/132 TFLOP/s (0.4325 µs) against 32 KB at 48 B/clk
    # (0.345 µs), one wgmma wait of 0.04 µs
    assert math.isclose(thr, 2 * 128 * 128 * 64 / (640e12 / 132), rel_tol=1e-12)
    assert math.isclose(lat, 0.04e-6, rel_tol=1e-12)
    assert math.isclose(loop.seconds, 32 * (thr + lat), rel_tol=1e-12)
    assert math.isclose(loop.share, thr / (thr + lat), rel_tol=1e-12) and loop.share > 0.9
    # the epilogues wait on their 17 round trips a tile: a small share of the SM
    assert tail.share < 0.5 and tail.seconds > loop.seconds / 3
    # bytes: the loop's operands, the epilogues' own P, M, V and w16 (26 B an element)
    assert loop.l2_bytes == 32 * 32768 and tail.l2_bytes == 2 * 26 * 128 * 128
    assert math.isclose(tail.hbm_bytes, 2 * 26 * 128 * 128, rel_tol=1e-12)


def test_two_identical_co_resident_ctas_take_twice_one_k_loop(mlp_dw):
    """One SM, two of the weight gradient's CTAs released together: their K loops ask 2 × 0.92 of
    the SM, so each runs at 1 / 1.83 — the pair's loops take 2 × the loop's throughput time
    (~1.83× one CTA's loop) — then their epilogues run together at full rate (2 × 0.3 < 1): the
    one's epilogue is not under the other's K loop."""
    loop, tail = _one(mlp_dw)
    one = Sim([Grid("one", 0, ((loop, tail),), HALF)], [()], INF, INF, sms=1).run().makespan
    assert math.isclose(one, loop.seconds + tail.seconds, rel_tol=1e-12)
    pair = Sim([Grid("pair", 0, ((loop, tail),) * 2, HALF)], [()], INF, INF, sms=1).run().makespan
    assert 2 * tail.share <= 1
    assert math.isclose(pair, 2 * loop.share * loop.seconds + tail.seconds, rel_tol=1e-9)
    k_loops = pair - tail.seconds
    assert 1.8 < k_loops / loop.seconds <= 2.0
    # what the model counted on before: the two independent, each at its own time alone; in step
    # the pair takes (2·share − 1) ≈ 0.83 of a K loop more
    assert pair - one > 0.8 * loop.seconds


def test_in_step_epilogues_are_not_hidden_but_staggered_work_overlaps(mlp_dw):
    """The same two CTAs, the second released when the first's K loop ends: its K loop runs
    under the first's epilogues (shares 0.92 + 0.3 > 1: both slow by that sum while they
    overlap), so the pair ends sooner than one after the other, but later than the two
    independent (the old model: the second ending one CTA's time after its release)."""
    loop, tail = _one(mlp_dw)
    one = loop.seconds + tail.seconds
    first = Grid("first", 0, ((loop, tail),), HALF)
    second = Grid("second", 0, ((loop, tail),), HALF, launch_s=loop.seconds)
    r = Sim([first, second], [(), ()], INF, INF, sms=1).run()
    assert loop.share + tail.share > 1
    assert loop.seconds + one < r.makespan < 2 * one
    assert r.end[0] > one                     # the first's epilogues slowed under the K loop


def test_phases_released_together_ask_the_chip_together(mlp_dw):
    """130 CTAs in step: their K loops ask L2 for 130 × 32 KB a trip (9.0 TB/s, past the central
    7.5), and their epilogues HBM for 130 × 851 KB over the epilogues' time (3.6 TB/s, past the
    pessimistic 3.2): the replay of the grid alone is longer than with unlimited bandwidth
    (the `serial` term), and longer than all its bytes spread evenly (the `l2`, `hbm` terms)."""
    loop, tail = _one(mlp_dw)
    ctas = cta_phases(mlp_dw.work, "central")
    assert len(ctas) == 130
    assert 130 * loop.l2_bytes / loop.seconds > ci.L2_BW.central
    assert ci.HBM_BW.pessimistic < 130 * tail.hbm_bytes / tail.seconds < ci.HBM_BW.central
    free = alone(ctas, 2, 132)
    limited = alone(ctas, 2, 132, False, ci.HBM_BW.central, ci.L2_BW.central)
    b = mlp_dw.bounds_us
    assert math.isclose(b["replay"]["central"], limited * US, rel_tol=1e-12)
    assert math.isclose(b["serial"]["central"], free * US, rel_tol=1e-12)
    for s in ci.SCENARIOS:
        assert b["replay"][s] > max(b["serial"][s], b["l2"][s], b["hbm"][s]), s


def test_the_tensor_bound_divides_by_the_sms_a_grid_holds(mlp_dw):
    """130 CTAs at 2 per SM: packed they hold 65 SMs (two programs' FLOPs on each), spread — the
    block scheduler's placement on an idle chip (inputs.PLACEMENT) — 130 SMs, one each; on 65
    free SMs they hold 65 whichever way."""
    w, per = mlp_dw.work, PerProgram.of(mlp_dw.work)
    flops = per.flops[0]
    assert all(f == flops for f in per.flops)
    sm_rate = 640e12 / 132
    assert held_sms(130, 2, pack=True) == 65 and held_sms(130, 2) == 130
    assert held_sms(130, 2, 65) == 65 and held_sms(600, 2, pack=True) == 132
    packed = bounds(w, per, 2, "central", pack=True)
    assert math.isclose(packed["tensor"], 2 * flops / sm_rate, rel_tol=1e-12)
    assert math.isclose(bounds(w, per, 2, "central")["tensor"], flops / sm_rate, rel_tol=1e-12)
    on65 = bounds(w, per, 2, "central", sms=65)
    assert math.isclose(on65["tensor"], 2 * flops / sm_rate, rel_tol=1e-12)
    # and the serial term on 65 SMs: every pair in step, as the two-CTA case
    loop, tail = _one(mlp_dw)
    assert math.isclose(on65["serial"], 2 * loop.share * loop.seconds + tail.seconds, rel_tol=1e-9)
    assert math.isclose(packed["serial"], on65["serial"], rel_tol=1e-12)


def test_ctas_of_both_lanes_share_an_sm():
    """A main-lane matmul CTA beside a weight-gradient CTA on one SM: both loops ask ~0.9 of it,
    so both slow; a row kernel's CTA (latency-bound, a small share) beside it does not."""
    hungry = Phase(10.0, 0.9)
    light = Phase(10.0, 0.05)
    a = Grid("main", 0, ((hungry,),), HALF)
    b = Grid("side", 1, ((hungry,),), HALF)
    r = Sim([a, b], [(), ()], INF, INF, sms=1).run()
    assert r.end == [pytest.approx(18.0)] * 2                # 10 s of work each at 1 / 1.8
    c = Grid("rows", 1, ((light,),), HALF)
    r = Sim([a, c], [(), ()], INF, INF, sms=1).run()
    assert r.end == [10.0, 10.0]


def test_a_moved_scenario_reads_the_moved_input_only():
    s = ci.Scenario("central", ((ci.L2_BW, "pessimistic"),))
    assert s == "central" and {s: 1}["central"] == 1
    assert ci.L2_BW[s] == 5.5e12 and ci.HBM_LATENCY[s] == 0.6e-6 and ci.L2_BW["central"] == 7.5e12


def test_the_replay_is_deterministic():
    sub = launches.submissions(PROD)[1]
    costs = model(PROD, "update", fake_stats(PROD))
    first = lanes.schedule(sub, costs, "central")
    again = lanes.schedule(sub, model(PROD, "update", fake_stats(PROD)), "central")
    assert first.end_s == again.end_s and first.makespan_s == again.makespan_s


@pytest.fixture(scope="module")
def tiny_report():
    tiny = profiles.get("tiny")
    return (json.loads(report("tiny", "sm_90a", "update", as_json=True, stats=fake_stats(tiny))),
            report("tiny", "sm_90a", "update", stats=fake_stats(tiny)))


def test_sensitivity_rows_by_swing(tiny_report):
    """One row per input of inputs.py, the largest swing first; an input moved to a value equal
    to its central one repeats the central figure; each moved figure is the graph replayed
    with that input alone moved."""
    j, text = tiny_report
    sens = j["sensitivity"]
    central = j["update_us"]["central"]
    assert sens["central_us"] == central and sens["scenario"] == "central"
    rows = sens["rows"]
    assert sorted(r["input"] for r in rows) == sorted(ci.INPUTS)
    swings = [r["swing_us"] for r in rows]
    assert swings == sorted(swings, reverse=True)
    for r in rows:
        rng = ci.INPUTS[r["input"]]
        assert (r["optimistic"], r["central"], r["pessimistic"]) == \
            (rng.optimistic, rng.central, rng.pessimistic) and r["source"] == rng.source
        figures = (r["optimistic_us"], central, r["pessimistic_us"])
        assert r["swing_us"] == max(figures) - min(figures)
        for end in ("optimistic", "pessimistic"):
            if rng[end] == rng.central:
                assert r[f"{end}_us"] == central
    assert sens["bracketed"] == list(BRACKETED) and sens["packed_us"] > 0
    tiny = profiles.get("tiny")
    sub = launches.submissions(tiny)[1]
    costs = model(tiny, "update", fake_stats(tiny))
    top = rows[0]
    moved = ci.Scenario("central", ((ci.INPUTS[top["input"]], "pessimistic"),))
    assert graph_us(sub, costs, moved) == top["pessimistic_us"]
    # the figure block and the text carry the same
    assert j["figure"]["most_sensitive_to"] == [r["input"] for r in rows[:3]]
    assert f"The figure is most sensitive to {', '.join(r['input'] for r in rows[:3])}." in text
    assert "| input | optimistic | central | pessimistic |" in text
