"""The cuda backend's graphs: each submission captured once, its lanes on their streams.

Each submission (`forward`, `update`, `final`: staging/layout.py SUBMISSIONS) is captured once from
the submission stream into a CUDA graph and issued by one cuGraphLaunch.  The capture holds exactly
the plan's edges (plan/launch_graph.py): each lane's launches in order on its own stream, a
cross-lane edge an event recorded after one launch and waited on before the other.  On sm_90a the
edges plan/launch_graph.programmatic allows are captured programmatically (the next kernel launches
while its predecessor works and waits for it at its first statement); if the driver refuses them,
every edge is captured in full (the same launches and bits, only the overlap lost).  The capture
variants (one lane, a no-op side lane) are the device check's experiments, never a run's.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from plan import launch_graph as _graph
from plan import launches as _launches

from .driver import DriverError
from .driver_module import Kernel, Module
from .driver_stream import Event, Graph, Stream

# the hand-written kernel that does nothing (one thread, no parameters): the device check's
# experiment replaces the side lane's launches with it (`noop_side_lane`); never in a run
NOOP_PTX = Path(_launches.__file__).resolve().parent / "kernels" / "noop.ptx"
NOOP_ENTRY = "noop"
NOOP_GRID = (1, 1, 1)


@dataclasses.dataclass(frozen=True)
class CapturePlan:
    """One submission's capture under the backend's options, per launch (list order)."""
    lanes: tuple                    # the stream it is captured on (MAIN_LANE or SIDE_LANE)
    launches: tuple                 # (kernel, packed parameters, grid)
    programmatic: tuple             # its edge to its lane's previous launch may be programmatic


class ProgrammaticLaunchRefused(RuntimeWarning):
    """The driver refused the graphs with programmatic edges; they were captured in full."""


class CudaCapture:
    """The capture half of the cuda backend (a mixin of CudaBackend).  It uses the backend's
    `dev` (the submission stream), `_submissions` (the plan's launch lists), `packed()` (one
    launch's kernel and parameters) and `_closers` (what close frees, in reverse)."""

    def _init_capture(self, pdl: bool, one_lane: bool, noop_side_lane: bool) -> None:
        """Capture options, read at each `instantiate` (see CudaBackend)."""
        self.pdl = pdl
        self.one_lane = one_lane
        self.noop_side_lane = noop_side_lane
        self.pdl_refused: str | None = None             # the driver's refusal, if it refused
        # submission → the edges its last capture made programmatic
        self.programmatic_edges: dict[int, int] = {}
        self._noop: Kernel | None = None
        self._graphs: list[Graph] = []
        self._params: list = []                         # kept alive as long as the graphs
        self._side_stream: Stream | None = None         # the side lane's stream during capture

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
            warnings.warn(f"cuda backend: the driver refused the graphs with programmatic edges "
                          f"({why}); captured with every edge full", ProgrammaticLaunchRefused,
                          stacklevel=2)

    def issue(self, submission: int) -> None:
        self._graphs[submission].launch()

    def _instantiate(self, t_base: int) -> None:
        for g in self._graphs:
            g.close()
        self._graphs = []
        self._params = []
        self._lane_streams(self.dev.stream)     # the side lane's stream, made before any capture
        for sub in self._submissions:
            launches = [self.packed(launch, t_base) + (launch.grid,) for launch in sub.launches]
            self._params.append(launches)
            plan = self._capture_plan(sub, launches)

            # one ordering event per launch another lane waits for, made before the capture
            # (capture turns its record/wait into edges; the graph keeps no event)
            marks: dict[int, Event] = {}

            def record(stream, sub=sub, plan=plan, marks=marks):
                self._record_lanes(stream, sub, plan, marks)

            try:
                for j in sorted({j for i, ds in enumerate(sub.deps) for j in ds
                                 if plan.lanes[j] != plan.lanes[i]}):
                    marks[j] = Event(timing=False)
                self._graphs.append(Graph(self.dev, record))
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
                           _graph.programmatic(shown))

    def _noop_kernel(self) -> Kernel:
        """The no-op kernel (NOOP_PTX), JIT-loaded on first use."""
        if self._noop is None:
            module = Module(NOOP_PTX.read_bytes(), "plan/kernels/noop.ptx")
            self._closers.append(module)
            self._noop = Kernel(module.function(NOOP_ENTRY), NOOP_ENTRY, [], threads=1, shared=0)
        return self._noop

    def _lane_streams(self, stream: Stream) -> dict[int, Stream]:
        """The capturing stream for the main lane, a stream of our own for the side lane."""
        if self._side_stream is None:
            self._side_stream = Stream()
            self._closers.append(self._side_stream)
        return {_launches.MAIN_LANE: stream, _launches.SIDE_LANE: self._side_stream}

    def _record_lanes(self, stream: Stream, sub, plan: CapturePlan, marks: dict) -> None:
        """Enqueue a submission's launches during capture so that the graph has exactly the
        plan's edges (plan/launch_graph.py, `sub.deps`): each lane's launches in order on its own
        stream; a cross-lane edge j → i is event marks[j] recorded on j's stream right after j
        and waited on by i's stream just before i.  The final launch is on the main lane and
        waits for the side lane's last launch, so the capture ends joined.  On one lane the
        stream's order holds every edge (each points back in the list)."""
        streams = self._lane_streams(stream)
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
