"""The cuda backend's graphs: each submission captured once, its lanes on their streams.

Each submission (`forward`, `update`, `final`: staging/layout.py SUBMISSIONS) is captured once from
the submission stream into a CUDA graph and issued by one cuGraphLaunch.  The capture holds exactly
the plan's edges (plan/launches/graph.py): each lane's launches in order on its own stream, a
cross-lane edge an event recorded after one launch and waited on before the other.  On sm_90a the
edges plan/launches/graph.py's `programmatic` allows are captured programmatically (the next kernel
launches while its predecessor works and waits for it at its first statement); if the driver
refuses them, every edge is captured in full (the same launches and bits, only the overlap lost).
The plan's priority lane (plan/launches/graph.py PRIORITY_LANE, the cost model's choice) is captured
on a stream of the device's greatest priority, the other lane at the default, and the graph is
instantiated to run each kernel node at the priority capture copied into it from its stream (a
main lane of higher priority gets a stream of its own, forked from the capturing stream and joined
back: the same nodes and edges).  Where the device has no priorities (range 0..0) every lane is at
the default: the same graph, with a note.  The capture variants (one lane, a no-op side lane, no
stream priority) are the device check's experiments, never a run's.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import kernels as _kernels
from coppelius.plan import launches as _launches

from coppelius.driver.calls import DriverError
from coppelius.driver.module import Kernel, Module
from coppelius.driver.stream import Event, Graph, Stream

# the hand-written kernel that does nothing (one thread, no parameters): the device check's
# experiment replaces the side lane's launches with it (`noop_side_lane`); never in a run
NOOP_PTX = Path(_kernels.__file__).resolve().parent / "noop.ptx"
NOOP_ENTRY = "noop"
NOOP_GRID = (1, 1, 1)
FORK, JOIN = "fork", "join"     # the events that bring a main lane's own stream into the capture


@dataclasses.dataclass(frozen=True)
class CapturePlan:
    """One submission's capture under the backend's options, per launch (list order)."""
    lanes: tuple                    # the stream it is captured on (MAIN_LANE or SIDE_LANE)
    launches: tuple                 # (kernel, packed parameters, grid)
    programmatic: tuple             # its edge to its lane's previous launch may be programmatic


class ProgrammaticLaunchRefused(RuntimeWarning):
    """The driver refused the graphs with programmatic edges; they were captured in full."""


class Capture:
    """The cuda backend's graphs (CudaBackend.capture): each submission captured from `stream`
    (the submission stream) under the capture options, launched by `issue`.  It is handed the
    plan's launch lists (`submissions`), `packed(launch, t_base)` (one launch's kernel and packed
    parameters: the backend resolves them) and `closers` (teardown.Closers: the streams and the
    no-op module it makes are freed with the backend's memory); the graphs it keeps are freed
    first (`take_graphs`)."""

    def __init__(self, stream: Stream, submissions: list, packed, closers, pdl: bool = True,
                 one_lane: bool = False, noop_side_lane: bool = False):
        """Capture options, read at each `instantiate` (see CudaBackend)."""
        self.stream, self.submissions = stream, submissions
        self.packed, self.closers = packed, closers
        self.pdl = pdl
        self.one_lane = one_lane
        self.noop_side_lane = noop_side_lane
        self.priority = True            # False: every lane at the default (a device check variant)
        self.priority_note: str | None = None           # why no lane got a priority, if none did
        self.priority_range: tuple[int, int] | None = None      # the device's (least, greatest)
        self.lane_priorities: dict[int, int] = {}       # lane → its stream's (driver's) priority
        self._streams: dict[int, Stream] = {}           # lane → its stream in the last capture
        self._own_streams: dict = {}                    # (lane, priority) → a stream of our own
        self.pdl_refused: str | None = None             # the driver's refusal, if it refused
        # submission → the edges its last capture made programmatic
        self.programmatic_edges: dict[int, int] = {}
        self._noop: Kernel | None = None
        self.graphs: list[Graph] = []
        # submission → its launches' (kernel, packed parameters, grid): kept alive as long as the
        # graphs that hold them (timing.py and digests.py launch them outside the graphs)
        self.params: list = []
        self.side_stream: Stream | None = None          # the side lane's (close() drains it)

    def instantiate(self, t_base: int) -> None:
        """Capture and instantiate every submission's graph.  If the capture with programmatic
        edges fails — whatever the failure: the driver's refusal, or the bindings' — capture again
        with every edge full: the same launches and bits, only the launch overlap is lost; a
        ProgrammaticLaunchRefused warning names the failure and `pdl_refused` keeps it (doctor and
        the device check report it).  A failure of the full-edge capture too is the error."""
        try:
            self._instantiate(t_base)
        except Exception as e:
            if not self.pdl:
                raise
            why = str(e) if isinstance(e, DriverError) else f"{type(e).__name__}: {e}"
            self.pdl, self.pdl_refused = False, why
            self._instantiate(t_base)
            # stacklevel: the caller of CudaBackend.instantiate
            warnings.warn(f"cuda backend: the driver refused the graphs with programmatic edges "
                          f"({why}); captured with every edge full", ProgrammaticLaunchRefused,
                          stacklevel=3)

    def issue(self, submission: int) -> None:
        self.graphs[submission].launch()

    def take_graphs(self) -> list[Graph]:
        """The graphs, handed over for closing (or leaving to process exit); none kept."""
        graphs, self.graphs = self.graphs, []
        return graphs

    def _instantiate(self, t_base: int) -> None:
        for g in self.graphs:
            g.close()
        self.graphs = []
        self.params = []
        streams = self._lane_streams(self.stream)       # made before any capture
        # the nodes run at their own priorities only when the graph is instantiated so
        node_priority = any(p != self.stream.priority for p in self.lane_priorities.values())
        for sub in self.submissions:
            launches = [self.packed(launch, t_base) + (launch.grid,) for launch in sub.launches]
            self.params.append(launches)
            plan = self._capture_plan(sub, launches)

            # one ordering event per launch another lane waits for, and a fork and a join when
            # the main lane has a stream of its own, made before the capture (capture turns their
            # record/wait into edges; the graph keeps no event)
            marks: dict = {}

            def record(stream, sub=sub, plan=plan, marks=marks):
                self._record_lanes(stream, sub, plan, marks)

            try:
                for j in sorted({j for i, ds in enumerate(sub.deps) for j in ds
                                 if plan.lanes[j] != plan.lanes[i]}):
                    marks[j] = Event(timing=False)
                if streams[_launches.MAIN_LANE] is not self.stream:
                    marks[FORK], marks[JOIN] = Event(timing=False), Event(timing=False)
                self.graphs.append(Graph(self.stream, record, node_priority))
            finally:
                for e in marks.values():
                    e.close()

    def _capture_plan(self, sub, launches) -> CapturePlan:
        """What the capture enqueues under the capture options: per launch its lane, the kernel,
        parameters and grid, and whether its lane edge may be programmatic."""
        shown = list(sub.launches)
        if self.noop_side_lane:     # a hand-written kernel: no programmatic edge into or out of it
            shown = [dataclasses.replace(x, function=_launches.RELEASE)
                     if x.lane == _launches.SIDE_LANE else x for x in shown]
            noop = self._noop_kernel()
            launches = [(noop, noop.pack([]), NOOP_GRID) if x.lane == _launches.SIDE_LANE else l
                        for x, l in zip(sub.launches, launches)]
        if self.one_lane:
            shown = [dataclasses.replace(x, lane=_launches.MAIN_LANE) for x in shown]
        return CapturePlan(tuple(x.lane for x in shown), tuple(launches),
                           launch_graph.programmatic(shown))

    def _noop_kernel(self) -> Kernel:
        """The no-op kernel (NOOP_PTX), JIT-loaded on first use."""
        if self._noop is None:
            module = Module(NOOP_PTX.read_bytes(), "plan/kernels/noop.ptx")
            self.closers.append(module)
            self._noop = Kernel(module.function(NOOP_ENTRY), NOOP_ENTRY, [], threads=1, shared=0)
        return self._noop

    def _lane_priorities(self) -> dict[int, int | None]:
        """lane → the priority its stream is created with: the device's greatest for the plan's
        priority lane, None (the default, the capturing stream's) for the other; every lane None
        without `priority` or where the device has no priorities (`priority_note` says so)."""
        least, greatest = self.priority_range = Stream.priority_range()
        ranks = launch_graph.priority_ranks(launch_graph.PRIORITY_LANE if self.priority else None)
        self.priority_note = None
        if any(ranks.values()) and least == greatest:
            self.priority_note = (f"the device has no stream priorities (range {least}.."
                                  f"{greatest}): every lane at the default, the same graph")
            return {lane: None for lane in ranks}
        return {lane: greatest if rank else None for lane, rank in ranks.items()}

    def _lane_streams(self, stream: Stream) -> dict[int, Stream]:
        """lane → its capture stream: the capturing stream for a main lane at the default
        priority, else a stream of our own at the lane's priority (made once, kept)."""
        out = {}
        for lane, priority in self._lane_priorities().items():
            if lane == _launches.MAIN_LANE and priority is None:
                out[lane] = stream
                continue
            if (lane, priority) not in self._own_streams:
                self._own_streams[lane, priority] = Stream(priority)
                self.closers.append(self._own_streams[lane, priority])
            out[lane] = self._own_streams[lane, priority]
        self._streams, self.side_stream = out, out[_launches.SIDE_LANE]
        self.lane_priorities = {lane: s.priority for lane, s in out.items()}
        return out

    def priority_report(self, submission: int) -> dict:
        """What the last capture gave the lanes: the device's (least, greatest) range, each
        lane's stream priority, the note (no priorities), and the kernel nodes of the
        submission's graph by priority, as planned (each launch at its lane's) and as the
        driver reports them."""
        lanes = self._capture_plan(self.submissions[submission], self.params[submission]).lanes
        return {"range": self.priority_range, "lanes": dict(self.lane_priorities),
                "note": self.priority_note,
                "planned": sorted(self.lane_priorities[lane] for lane in lanes),
                "nodes": sorted(self.graphs[submission].kernel_priorities())}

    def _record_lanes(self, stream: Stream, sub, plan: CapturePlan, marks: dict) -> None:
        """Enqueue a submission's launches during capture so that the graph has exactly the
        plan's edges (plan/launches/graph.py, `sub.deps`): each lane's launches in order on its own
        stream; a cross-lane edge j → i is event marks[j] recorded on j's stream right after j
        and waited on by i's stream just before i.  The final launch is on the main lane and
        waits for the side lane's last launch, so the capture ends joined.  On one lane the
        stream's order holds every edge (each points back in the list)."""
        streams = self._streams
        main = streams[_launches.MAIN_LANE]
        if main is not stream:                          # the main lane's stream joins the capture
            marks[FORK].record(stream)
            main.wait(marks[FORK])
        self.programmatic_edges[sub.index] = 0
        for i, (kernel, params, grid) in enumerate(plan.launches):
            on = streams[plan.lanes[i]]
            for j in sub.deps[i]:
                if j in marks and plan.lanes[j] != plan.lanes[i]:
                    on.wait(marks[j])
            overlap = self.pdl and plan.programmatic[i] and kernel.pdl
            kernel.launch(on, grid, params, programmatic=overlap)
            self.programmatic_edges[sub.index] += overlap
            if i in marks:
                marks[i].record(on)
        if main is not stream:                          # and is joined back before its end
            marks[JOIN].record(main)
            stream.wait(marks[JOIN])
