"""The cuda backend: the plan's launch lists on an NVIDIA GPU through the driver API.

Only runtime dependencies (cuda-bindings, numpy, cffi): no Triton, no torch.  PTX comes from
`kernels_ptx/<profile>/<target>/` (the target chosen by compute capability: 9.0 → sm_90a,
≥ 8.0 → sm_80, else refused); the driver's JIT loads every module first, and a kernel the device
cannot launch as its manifest asks (shared memory, threads per block) is refused before any memory
is allocated.  Staging is the 8 MiB pinned region mapped into the device; every device buffer of
plan/buffers.py is one cuMemAlloc.  Each submission is captured once into a CUDA graph and issued
by one cuGraphLaunch; on sm_90a the edges plan/launch_graph.programmatic allows are captured
programmatically (the next kernel launches while its predecessor works and waits for it at its
first statement).  Closing waits a bounded time for issued work; what the GPU may still touch
after that is never freed (process exit frees it).
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path

from plan import launch_graph as _graph
from plan import launches as _launches
from staging import layout as SL
from staging import records as R
from staging.views import StagingViews, poison

from . import cuda_timing
from . import driver as drv
from . import ptx
from .backend import Backend, BackendUnavailable, DeviceError, DeviceInfo
from .cuda_timing import TIMING_LEAD_MAX, TIMING_LEAD_MIN, SubmissionTiming  # noqa: F401  (API)

DRAIN_TIMEOUT_S = 10.0      # close waits this long for issued work before leaving memory to exit
DRAIN_POLL_S = 1e-3
REFUSALS_SHOWN = 4          # kernels named in a refusal; the rest are counted
SHARED_HINT = ("the sm_80 kernels need up to 98,304 B of shared memory per block: an A100 (cc 8.0), "
               "an H100/H200 (cc 9.0) and the cc 8.6/8.9/12.0 GPUs (about 99 KiB) allow that "
               "(README: which GPUs run)")
THREADS_HINT = ("the JIT gave it more registers than that many threads can hold; "
                "`coppelius doctor` lists the registers per function")
# the hand-written kernel that does nothing (one thread, no parameters): the device check's
# experiment replaces the side lane's launches with it (`noop_side_lane`); never in a run
NOOP_PTX = Path(_launches.__file__).resolve().parent / "kernels" / "noop.ptx"
NOOP_ENTRY = "noop"
NOOP_GRID = (1, 1, 1)


@dataclasses.dataclass(frozen=True)
class _CapturePlan:
    """One submission's capture under the backend's options, per launch (list order)."""
    lanes: tuple                    # the stream it is captured on (MAIN_LANE or SIDE_LANE)
    launches: tuple                 # (kernel, packed parameters, grid)
    programmatic: tuple             # its edge to its lane's previous launch may be programmatic


class ProgrammaticLaunchRefused(RuntimeWarning):
    """The driver refused the graphs with programmatic edges; they were captured in full."""


class KernelRefused(BackendUnavailable):
    """The device cannot launch a kernel as its manifest asks."""


def refuse_unfit(kernels: dict, device) -> None:
    """Refuse, before any work, the kernels this device cannot launch as their manifests ask:
    more shared memory per block than the device's opt-in limit, or more threads per block than
    the driver allows the function."""
    problems, hints = [], []
    for k in kernels.values():
        a = k.attributes
        if k.shared_per_block > device.shared_optin:
            problems.append(f"{k.name} needs {k.shared_per_block:,} B of shared memory per block, "
                            f"the limit is {device.shared_optin:,} B")
            hints.append(SHARED_HINT)
        if k.threads > a.max_threads:
            problems.append(f"{k.name} launches {k.threads} threads per block, the driver allows "
                            f"{a.max_threads} at its {a.registers} registers")
            hints.append(THREADS_HINT)
    if problems:
        more = len(problems) - REFUSALS_SHOWN
        shown = "; ".join(problems[:REFUSALS_SHOWN]) + (f"; and {more} more" if more > 0 else "")
        cc = device.compute_capability
        raise KernelRefused(f"{device.name} (compute capability {cc // 10}.{cc % 10}) cannot run "
                            f"{len(problems)} kernel launch shape(s): {shown}",
                            "; ".join(dict.fromkeys(hints)))


def choose_target(compute_capability: int) -> str:
    """9.0 → sm_90a (wgmma); any other ≥ 8.0 → sm_80; older devices are refused."""
    if compute_capability == 90:
        return "sm_90a"
    if compute_capability >= 80:
        return "sm_80"
    raise BackendUnavailable(f"compute capability {compute_capability // 10}.{compute_capability % 10}"
                             " is older than 8.0: no PTX target for it",
                             "Coppelius needs an Ampere (sm_80) or newer GPU")


class CudaBackend(Backend):
    name = "cuda"
    code = R.BACKEND_CUDA

    def __init__(self, profile, device: drv.Device | None = None, pdl: bool = True,
                 one_lane: bool = False, noop_side_lane: bool = False):
        """Capture options (read at each `instantiate`; a run uses the defaults): `pdl`: the
        launches the plan allows get programmatic edges to their lane's previous launch
        (plan/launch_graph.programmatic) where the loaded kernel was built to wait for it
        (sm_90a); False captures every edge in full.  `one_lane`: every launch on one stream in
        list order (a valid order: every edge points back), the side lane's overlap given up.
        `noop_side_lane`: each side-lane launch replaced by one launch of the no-op kernel
        (NOOP_PTX), its edges kept: the graph without the side lane's work.  The last two are
        the device check's experiments (tools/gpu_check_launches.py) and change the results."""
        super().__init__(profile)
        self.pdl = pdl
        self.one_lane = one_lane
        self.noop_side_lane = noop_side_lane
        self.pdl_refused: str | None = None             # the driver's refusal, if it refused
        self.programmatic_edges: dict[int, int] = {}    # submission → edges captured so, last capture
        self._noop: drv.Kernel | None = None
        self._closers = []
        self._graphs: list[drv.Graph] = []
        self._snapshot: drv.DeviceBuffer | None = None
        self._copy_stream: drv.Stream | None = None
        self._side_stream: drv.Stream | None = None     # the side lane's stream during capture
        self.dev = device or drv.Device()
        self._closers.append(self.dev)
        self._abandoned: str | None = None
        self.left_to_exit: list = []    # what close() did not free (the GPU may still touch it)
        try:
            self.target = choose_target(self.dev.compute_capability)
            self.manifest = ptx.Manifest.load(profile.name, self.target)
            # every module JIT-loaded and its functions' attributes read before any allocation
            t = time.perf_counter()
            self.kernels = self.manifest.kernels(self._closers)
            self.jit_s = time.perf_counter() - t
            refuse_unfit(self.kernels, self.dev)
            for k in self.kernels.values():
                k.opt_in_shared()
            self.region = drv.MappedRegion(SL.REGION_BYTES)
            self._closers.append(self.region)
            poison(self.region.array)
            self.staging = StagingViews(self.region.array, profile)
            self.allocate_buffers()
            self._submissions = _launches.submissions(profile)
        except BaseException:
            self.close()
            raise

    def device(self) -> DeviceInfo:
        return DeviceInfo(self.dev.name, self.dev.compute_capability, self.dev.driver_version,
                          self.target)

    def _alloc(self, spec, fill: int) -> drv.DeviceBuffer:
        b = drv.DeviceBuffer(spec.nbytes)
        self._closers.append(b)
        drv.memset_d8(b.ptr, fill, spec.nbytes, self.dev.stream)
        return b

    # ---- payload through the transfer window (synchronous: the window is reused per chunk;
    # bounds checked by the base)
    def _upload_chunk(self, offset: int, nbytes: int) -> None:
        drv.memcpy_htod(self.buffers["pmv"].ptr + offset, self.region.host_ptr + SL.TRANSFER_WINDOW,
                        nbytes, self.dev.stream)
        self.dev.synchronize()

    def _download_chunk(self, offset: int, nbytes: int) -> None:
        drv.memcpy_dtoh(self.region.host_ptr + SL.TRANSFER_WINDOW, self.buffers["pmv"].ptr + offset,
                        nbytes, self.dev.stream)
        self.dev.synchronize()

    # ---- snapshot for publication while training goes on (one extra payload on the device)
    def snapshot(self) -> None:
        if self._snapshot is None:
            self._snapshot = drv.DeviceBuffer(self.buffers["pmv"].nbytes)
            self._closers.append(self._snapshot)
            self._copy_stream = drv.Stream()
            self._closers.append(self._copy_stream)
        # on the submission stream, after the update that was just fenced; ~0.25 ms for 692 MB
        drv.memcpy_dtod(self._snapshot.ptr, self.buffers["pmv"].ptr, self._snapshot.nbytes,
                        self.dev.stream)
        self.dev.synchronize()

    def _download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        self.dev.make_current()
        drv.memcpy_dtoh(self.region.host_ptr + SL.TRANSFER_WINDOW, self._snapshot.ptr + offset,
                        nbytes, self._copy_stream)
        self._copy_stream.synchronize()

    # ---- launch lists (scalars resolved by the base)
    def _buffer_arg(self, ref) -> int:
        return self.buffers[ref.buffer].ptr + ref.byte_offset

    def _staging_arg(self, ref) -> int:
        return self.region.device_ptr + ref.offset

    def packed(self, launch, t_base: int):
        kernel = self.kernels[launch.kernel]
        values = [self.resolve(a, t_base) for _, a in launch.args]
        # Triton's hidden trailing scratch pointers: null unless the kernel asked for scratch, then
        # per-program bytes × programs in the grid, as Triton's own launcher allocates
        programs = launch.grid[0] * launch.grid[1] * launch.grid[2]
        for size in kernel.scratch:
            if size:
                buf = drv.DeviceBuffer(size * programs)
                self._closers.append(buf)
                values.append(buf.ptr)
            else:
                values.append(0)
        values += [0] * (len(kernel.param_types) - len(values))
        return kernel, kernel.pack(values)

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
            why = str(e) if isinstance(e, drv.DriverError) else f"{type(e).__name__}: {e}"
            self.pdl, self.pdl_refused = False, why
            self._instantiate(t_base)
            warnings.warn(f"cuda backend: the driver refused the graphs with programmatic edges "
                          f"({why}); captured with every edge full", ProgrammaticLaunchRefused,
                          stacklevel=2)

    def _instantiate(self, t_base: int) -> None:
        for g in self._graphs:
            g.close()
        self._graphs = []
        self._params = []                       # kept alive as long as the graphs
        self._lane_streams(self.dev.stream)     # the side lane's stream, made before any capture
        for sub in self._submissions:
            launches = [self.packed(launch, t_base) + (launch.grid,) for launch in sub.launches]
            self._params.append(launches)
            plan = self._capture_plan(sub, launches)

            # one ordering event per launch another lane waits for, made before the capture
            # (capture turns its record/wait into edges; the graph keeps no event)
            marks: dict[int, drv.Event] = {}

            def record(stream, sub=sub, plan=plan, marks=marks):
                self._record_lanes(stream, sub, plan, marks)

            try:
                for j in sorted({j for i, ds in enumerate(sub.deps) for j in ds
                                 if plan.lanes[j] != plan.lanes[i]}):
                    marks[j] = drv.Event(timing=False)
                self._graphs.append(drv.Graph(self.dev, record))
            finally:
                for e in marks.values():
                    e.close()

    def _capture_plan(self, sub, launches) -> "_CapturePlan":
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
        return _CapturePlan(tuple(x.lane for x in shown), tuple(launches),
                            _graph.programmatic(shown))

    def _noop_kernel(self) -> drv.Kernel:
        """The no-op kernel (NOOP_PTX), JIT-loaded on first use."""
        if self._noop is None:
            module = drv.Module(NOOP_PTX.read_bytes(), "plan/kernels/noop.ptx")
            self._closers.append(module)
            self._noop = drv.Kernel(module.function(NOOP_ENTRY), NOOP_ENTRY, [], threads=1,
                                    shared=0)
        return self._noop

    def _lane_streams(self, stream: drv.Stream) -> dict[int, drv.Stream]:
        """The capturing stream for the main lane, a stream of our own for the side lane."""
        if self._side_stream is None:
            self._side_stream = drv.Stream()
            self._closers.append(self._side_stream)
        return {_launches.MAIN_LANE: stream, _launches.SIDE_LANE: self._side_stream}

    def _record_lanes(self, stream: drv.Stream, sub, plan: "_CapturePlan", marks: dict) -> None:
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

    def issue(self, submission: int) -> None:
        self._graphs[submission].launch()

    def time_submission(self, submission: int, repeats: int,
                        lead: int = TIMING_LEAD_MIN) -> SubmissionTiming:
        """The launch list outside its graph and the graph (host/cuda_timing.py)."""
        return cuda_timing.time_submission(self, submission, repeats, lead)

    def time_graph(self, submission: int, repeats: int) -> list:
        """The graph as captured now, replay by replay (host/cuda_timing.py), µs."""
        return cuda_timing.time_graph(self, submission, repeats)

    def time_alone(self, submission: int, indices, repeats: int) -> list:
        """Chosen launches each by itself on an idle stream (host/cuda_timing.py), µs."""
        return cuda_timing.time_alone(self, submission, indices, repeats)

    def check(self) -> bool:
        return self.dev.query()

    def synchronize(self) -> None:
        self.dev.synchronize()

    def abandon(self, reason: str) -> None:
        """Something may still touch device memory or staging: close() frees nothing."""
        self._abandoned = self._abandoned or reason

    def _drained(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for every stream to go idle; a faulted stream runs nothing more."""
        streams = [s for s in (self.dev.stream, self._copy_stream, self._side_stream)
                   if s is not None]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if all(s.query() for s in streams):
                    return True
            except DeviceError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(DRAIN_POLL_S)

    def close(self) -> None:
        """Graphs, then every allocation in reverse order, once the streams are idle; a failure is
        reported, never raised.  Streams still busy after DRAIN_TIMEOUT_S (a fence timeout, a hung
        kernel) or a thread still using staging: nothing is freed, process exit frees it."""
        if not self._closers and not self._graphs:
            return
        if self._abandoned is None and not self._drained(DRAIN_TIMEOUT_S):
            self._abandoned = f"the GPU is still busy {DRAIN_TIMEOUT_S:g} s after the run"
        if self._abandoned is not None:
            warnings.warn(f"cuda backend: {self._abandoned}: device memory, the mapped staging "
                          "region, the modules and the context are left for process exit to free",
                          drv.ReleaseWarning, stacklevel=2)
            self.left_to_exit += self._graphs + self._closers   # referenced, never freed
            self._graphs, self._closers = [], []
            return
        for g in self._graphs:
            g.close()
        self._graphs = []
        for c in reversed(self._closers):
            try:
                c.close()
            except Exception as e:          # not a driver return: still report, keep closing
                warnings.warn(f"closing {type(c).__name__}: {type(e).__name__}: {e}",
                              drv.ReleaseWarning, stacklevel=2)
        self._closers = []
