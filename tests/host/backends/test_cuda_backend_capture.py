"""The cuda backend's capture through the fake driver (tools/fake_driver.py) — any
failure of the programmatic capture falls back to full edges, a failed capture leaves no graph
behind, and the device check's capture variants (one lane, a no-op side lane) and timings."""
import numpy as np
import pytest

from coppelius.driver import calls as drv
from coppelius.driver.device import Device
from coppelius.driver.stream import Graph, Stream
from coppelius.backends.cuda import ptx
from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import launches
from coppelius.plan import profiles
from coppelius.staging import layout as L

from tests.support.fake_driver_fixture import fake  # noqa: F401  (the fixture)
from tools.fake_driver import CUresult

TINY = profiles.get("tiny")

pytestmark = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


def test_any_failure_of_the_programmatic_capture_falls_back_to_full_edges(fake, monkeypatch):
    """Not only the driver's refusal (a DriverError): a failure the bindings raise while capturing
    the programmatic launches (here a TypeError from cuLaunchKernelEx) also gets the full-edge
    capture, with the failure named."""
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.backends.cuda.capture import ProgrammaticLaunchRefused
    f = fake((9, 0))

    def broken(*a, **k):
        raise TypeError("argument 'config': CUlaunchConfig expected")
    monkeypatch.setattr(f, "cuLaunchKernelEx", broken)
    with CudaBackend(TINY) as b:
        with pytest.warns(ProgrammaticLaunchRefused, match="TypeError: argument 'config'"):
            b.instantiate(3)
        assert not b.pdl and b.pdl_refused.startswith("TypeError")
        assert not any(b.programmatic_edges.values()) and len(b.capture.graphs) == 3
        assert len(f.live_graphs) == 3 == len(f.live_execs)      # the abandoned one destroyed


def test_a_failure_of_the_full_capture_after_a_fallback_is_raised(fake, monkeypatch):
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake((9, 0))

    def broken(*a, **k):
        raise TypeError("bindings broke")
    monkeypatch.setattr(f, "cuLaunchKernelEx", broken)
    monkeypatch.setattr(f, "cuLaunchKernel", broken)
    with CudaBackend(TINY) as b, pytest.raises(TypeError, match="bindings broke"):
        b.instantiate(3)


def test_a_failed_capture_destroys_the_graph_the_driver_made(fake):
    """The capture is ended when recording fails; the graph the driver returns for what was
    captured so far is destroyed, never left behind."""
    f = fake()
    dev = Device()

    def record(stream):
        drv.check(f.cuLaunchKernel("k", 1, 1, 1, 1, 1, 1, 0, stream.handle, 0, 0), "cuLaunchKernel")
        raise RuntimeError("recording failed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        Graph(dev.stream, record)
    assert len(f.graphs) == 1 and not f.live_graphs           # made, then destroyed
    dev.close()


def test_a_graph_that_fails_to_instantiate_is_destroyed(fake, monkeypatch):
    f = fake()
    dev = Device()
    monkeypatch.setattr(f, "cuGraphInstantiate",
                        lambda g, flags: (CUresult.CUDA_ERROR_INVALID_VALUE, None))
    with pytest.raises(drv.DriverError, match="cuGraphInstantiate"):
        Graph(dev.stream, lambda stream: None)
    assert len(f.graphs) == 1 and not f.live_graphs
    dev.close()


def test_one_lane_captures_every_launch_on_one_stream_in_list_order(fake):
    """The one-lane experiment: one stream, each node after the one before it (the list order is
    a topological order, so every plan edge holds), programmatic where two Triton kernels meet."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake((9, 0))
    subs = launches.submissions(TINY)
    with CudaBackend(TINY, one_lane=True) as b:
        b.instantiate(3)
        for sub, nodes in zip(subs, list(f.graphs.values())[-3:]):
            assert len({n.stream for n in nodes}) == 1, sub.name
            assert [n.deps for n in nodes] == [frozenset({i - 1}) if i else frozenset()
                                               for i in range(len(nodes))], sub.name
            anc = launch_graph.ancestors([tuple(n.deps) for n in nodes])
            assert all(anc[i] >> j & 1 for i, ds in enumerate(sub.deps) for j in ds), sub.name
            relaned = [x.__class__(**{**x.__dict__, "lane": launches.MAIN_LANE})
                       for x in sub.launches]
            assert tuple(n.programmatic for n in nodes) == launch_graph.programmatic(relaned)
        assert b.programmatic_edges[L.SUBMISSION_UPDATE] > 0


def test_a_noop_side_lane_keeps_the_graph_and_drops_the_work(fake):
    """The no-op experiment: every side-lane node launches the hand-written no-op kernel on one
    thread, with the plan's edges unchanged and no programmatic edge into or out of it; the
    main-lane nodes are the run's."""
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.backends.cuda.capture import NOOP_ENTRY
    f = fake((9, 0))
    update = launches.submissions(TINY)[L.SUBMISSION_UPDATE]
    with CudaBackend(TINY) as b:
        b.instantiate(3)
        plain = list(f.graphs.values())[-2]
        b.noop_side_lane = True
        b.instantiate(3)
        noop = list(f.graphs.values())[-2]
    assert [n.deps for n in noop] == [frozenset(d) for d in update.deps]
    side = [i for i, x in enumerate(update.launches) if x.lane == launches.SIDE_LANE]
    assert side
    for i, (a, n) in enumerate(zip(plain, noop)):
        if i in side:
            assert n.launch[0] == NOOP_ENTRY and n.launch[1] == (1, 1, 1) and not n.programmatic
            assert a.launch[0] != NOOP_ENTRY
        else:
            assert n.launch[:4] == a.launch[:4], update.launches[i].label
        if i and i - 1 in side and update.launches[i].lane == launches.SIDE_LANE:
            assert not n.programmatic
    assert any(a.programmatic for i, a in enumerate(plain) if i in side)   # the plan's had some


def test_graph_replays_and_launches_alone_are_timed_between_events(fake):
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake()
    with CudaBackend(TINY) as b:
        b.instantiate(-1)
        g = b.time_graph(L.SUBMISSION_UPDATE, repeats=4)
        assert len(g) == 4 and min(g) > 0
        alone = b.time_alone(L.SUBMISSION_UPDATE, [2, 5], repeats=3)
        assert np.asarray(alone).shape == (2, 3) and (np.asarray(alone) >= 0).all()
        update = b.capture.params[L.SUBMISSION_UPDATE]
        # each launch alone: warm-up + 3, in the order asked
        assert [r[0] for r in f.launch_log[-8:]] == ([update[2][0].function] * 4
                                                    + [update[5][0].function] * 4)
        with pytest.raises(ValueError, match="at least 1"):
            b.time_graph(L.SUBMISSION_UPDATE, repeats=0)
    assert not f.events


def _update_graph(f, b):
    """The fake's nodes of the update graph the backend captured last, and its instantiate flags."""
    handle = list(f.graphs)[-len(b.capture.graphs) + L.SUBMISSION_UPDATE]
    return f.graphs[handle], f.instantiate_flags[handle]


@pytest.mark.parametrize("first", [launches.SIDE_LANE, launches.MAIN_LANE, None])
def test_the_capture_gives_the_plans_priority_lane_the_greatest_priority(fake, monkeypatch, first):
    """Each kernel node of the update graph carries its lane's stream priority: the device's
    greatest for plan/launches/graph.py PRIORITY_LANE, the default 0 for the other, and the graph is
    instantiated to run nodes at their own priorities.  Pointed at the main lane (which then
    captures on a stream of its own, forked and joined) or at none, the capture follows: a
    capture that ignored the plan's choice fails here.  The nodes and edges are the plan's."""
    from coppelius.backends.cuda.backend import CudaBackend
    monkeypatch.setattr(launch_graph, "PRIORITY_LANE", first)
    f = fake((9, 0), priority_range=(0, -3))
    update = launches.submissions(TINY)[L.SUBMISSION_UPDATE]
    with CudaBackend(TINY) as b:
        b.instantiate(3)
        nodes, flags = _update_graph(f, b)
        assert b.lane_priorities == {lane: -3 if lane == first else 0 for lane in launches.LANES}
    assert [n.priority for n in nodes] == [-3 if x.lane == first else 0 for x in update.launches]
    assert [n.deps for n in nodes] == [frozenset(d) for d in update.deps]
    assert flags == (0 if first is None else 8)      # CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
    assert len({n.stream for n in nodes}) == 2
    assert (nodes[0].stream == 1) == (first != launches.MAIN_LANE)   # 1: the submission stream


@pytest.mark.parametrize("why", ["variant", "device"])
def test_no_stream_priority_captures_the_same_graph_at_the_default(fake, why):
    """The device check's "no stream priority" variant (priority=False) and a device whose range
    is 0..0: every node at the default, no node-priority flag, the plan's nodes and edges; the
    device without priorities gets a note, the variant none."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake((9, 0), priority_range=(0, 0) if why == "device" else (0, -5))
    update = launches.submissions(TINY)[L.SUBMISSION_UPDATE]
    with CudaBackend(TINY) as b:
        b.priority = why != "variant"
        b.instantiate(3)
        nodes, flags = _update_graph(f, b)
        assert (b.priority_note is not None) == (why == "device")
        report = b.priority_report(L.SUBMISSION_UPDATE)
    assert {n.priority for n in nodes} == {0} and flags == 0
    assert [n.deps for n in nodes] == [frozenset(d) for d in update.deps]
    assert report["nodes"] == report["planned"] == [0] * len(update.launches)


def test_the_priorities_reported_are_the_drivers(fake, monkeypatch):
    """A stream's priority is read back from the driver (cuStreamGetPriority: after its clamping),
    and the doctor's comparison reads the graph's nodes (cuGraphKernelNodeGetAttribute): a driver
    that left the stream's priority out of its nodes shows as nodes ≠ planned."""
    from coppelius.backends.cuda.backend import CudaBackend
    f = fake((9, 0), priority_range=(0, -2))
    dev = Device()
    assert Stream(-9).priority == -2 and Stream(7).priority == 0
    assert Stream().priority == 0
    dev.close()
    with CudaBackend(TINY) as b:
        b.instantiate(3)
        report = b.priority_report(L.SUBMISSION_UPDATE)
        assert report["range"] == (0, -2) and report["nodes"] == report["planned"]
        assert -2 in report["nodes"] and 0 in report["nodes"]
        unset = type("Value", (), {"priority": 0})
        monkeypatch.setattr(f, "cuGraphKernelNodeGetAttribute",
                            lambda node, attr: (CUresult.CUDA_SUCCESS, unset))
        assert b.priority_report(L.SUBMISSION_UPDATE)["nodes"] != report["planned"]
