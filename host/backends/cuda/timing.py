"""Device time of an instantiated submission on the cuda backend, between driver events.

Three measurements the device check makes (tools/gpu_check/launches.py), each through the
backend's own graphs and packed launches on its submission stream (the `Capture` that
`CudaBackend.instantiate` filled), with `check()` (the backend's: raises on a device fault) after
each wait:
  `time_submission`  the launch list replayed outside its graph with an event between launches,
                     behind graph replays queued ahead, and the graph between two events;
  `time_graph`       the graph alone, between two events behind the same lead (a capture variant
                     against another: programmatic edges, one lane, a no-op side lane);
  `time_alone`       chosen launches each by itself on an idle stream: an event, the launch, an
                     event, then wait (nothing queued before or beside it).
The work is really done each time (an update trains), so the buffers must hold a state a forward
submission left; the run's results are not what this is for.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from coppelius.driver.stream import Event, elapsed_ms

TIMING_LEAD_MIN = 2         # graph replays queued ahead of a timed launch list (at least) ...
TIMING_LEAD_MAX = 32        # ... and at most (a host far slower than the device gains nothing more)
LEAD_MARGIN = 1.5           # replays ahead: this many times the host's enqueue time over a replay


@dataclass
class SubmissionTiming:
    """One submission timed two ways, `repeats` times: launch by launch outside its graph (an
    event between launches) and as one graph replay (an event either side)."""
    labels: tuple[str, ...]                 # (launches,) the plan's stage names
    kernels: tuple[str, ...]                # (launches,) manifest entries
    launch_us: list = field(default_factory=list)    # (repeats, launches) event to next event
    graph_us: list = field(default_factory=list)     # (repeats,) one graph replay
    enqueue_us: list = field(default_factory=list)   # (repeats,) host time to enqueue the list
    lead_us: list = field(default_factory=list)      # (repeats,) device time queued ahead of it
    lead: int = TIMING_LEAD_MIN             # graph replays queued ahead, after the warm-up
    programmatic_edges: int = 0             # edges of the timed graph captured programmatically
    full_edges_graph_us: list = field(default_factory=list)  # (repeats,) recaptured, all full
    pdl_refused: str | None = None          # the driver's refusal of programmatic edges, if any

    @property
    def starved(self) -> int:
        """Repeats where the host took longer to enqueue the list than the device had queued
        ahead: their launch times may hold host time (the device waited for the next launch)."""
        return sum(e > lead + g for e, lead, g in zip(self.enqueue_us, self.lead_us, self.graph_us))


def _check_repeats(repeats: int) -> None:
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")


def time_submission(capture, check, submission: int, repeats: int,
                    lead: int = TIMING_LEAD_MIN) -> SubmissionTiming:
    """The launch list outside its graph with an event between launches, and the graph between
    two events, `repeats` times after one warm-up repeat.  Graph replays are queued ahead of each
    timed list (`lead` of them, more if the warm-up shows the host needs longer to enqueue the
    list), so the device is still busy while the host enqueues: an event-to-event time is then the
    launch and its gap to the next, not host time (`SubmissionTiming.starved` counts the repeats
    where that did not hold)."""
    _check_repeats(repeats)
    graph, launches = capture.graphs[submission], capture.params[submission]
    sub = capture.submissions[submission]
    timing = SubmissionTiming(tuple(x.label for x in sub.launches),
                              tuple(x.kernel for x in sub.launches))
    stream = capture.stream
    events = [Event() for _ in range(len(launches) + 5)]
    lead_0, lead_1, graph_1, marks = events[0], events[1], events[2], events[3:]
    try:
        for r in range(repeats + 1):                        # repeat 0 warms up, not kept
            lead_0.record(stream)
            for _ in range(lead):
                graph.launch()
            lead_1.record(stream)
            graph.launch()
            graph_1.record(stream)
            t = time.perf_counter()
            marks[0].record(stream)
            for (kernel, params, grid), mark in zip(launches, marks[1:]):
                kernel.launch(stream, grid, params)
                mark.record(stream)
            enqueue_us = (time.perf_counter() - t) * 1e6
            marks[len(launches)].synchronize()
            check()
            graph_us = elapsed_ms(lead_1, graph_1) * 1e3
            lead_us = elapsed_ms(lead_0, lead_1) * 1e3
            if r == 0:      # enough replays ahead that the host finishes enqueuing first
                need = math.ceil(LEAD_MARGIN * enqueue_us / max(graph_us, 1e-3))
                lead = min(max(lead, need), TIMING_LEAD_MAX)
                timing.lead = lead
                continue
            timing.launch_us.append([elapsed_ms(a, b) * 1e3
                                     for a, b in zip(marks, marks[1:len(launches) + 1])])
            timing.graph_us.append(graph_us)
            timing.enqueue_us.append(enqueue_us)
            timing.lead_us.append(lead_us)
    finally:
        for e in events:
            e.close()
    return timing


def time_graph(capture, check, submission: int, repeats: int,
               lead: int = TIMING_LEAD_MIN) -> list:
    """(repeats,) µs of one replay of the submission's graph as captured now, each behind `lead`
    replays queued ahead (so the host's enqueue is not in it), after one warm-up repeat."""
    _check_repeats(repeats)
    graph, stream = capture.graphs[submission], capture.stream
    start, end = Event(), Event()
    out = []
    try:
        for r in range(repeats + 1):
            for _ in range(lead):
                graph.launch()
            start.record(stream)
            graph.launch()
            end.record(stream)
            end.synchronize()
            check()
            if r:
                out.append(elapsed_ms(start, end) * 1e3)
    finally:
        start.close()
        end.close()
    return out


def time_alone(capture, check, submission: int, indices, repeats: int) -> list:
    """(len(indices), repeats) µs: each chosen launch of the submission by itself on an idle
    stream (event, launch, event, wait), `repeats` times after one warm-up launch."""
    _check_repeats(repeats)
    launches, stream = capture.params[submission], capture.stream
    start, end = Event(), Event()
    out = []
    try:
        for i in indices:
            kernel, params, grid = launches[i]
            row = []
            for r in range(repeats + 1):
                start.record(stream)
                kernel.launch(stream, grid, params)
                end.record(stream)
                end.synchronize()
                check()
                if r:
                    row.append(elapsed_ms(start, end) * 1e3)
            out.append(row)
    finally:
        start.close()
        end.close()
    return out
