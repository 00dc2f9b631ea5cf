"""The cuda backend: the plan's launch lists on an NVIDIA GPU through the driver API.

Only runtime dependencies (cuda-bindings, numpy, cffi): no Triton, no torch.  PTX comes from
`kernels_ptx/<profile>/<target>/` (the target chosen by compute capability: 9.0 → sm_90a,
≥ 8.0 → sm_80, else refused); the driver's JIT loads every module first, and a kernel the device
cannot launch as its manifest asks (shared memory, threads per block) is refused before any memory
is allocated.  Staging is the 8 MiB pinned region mapped into the device; every device buffer of
plan/buffers.py is one cuMemAlloc.  This module holds the backend's primitives (memory, staging,
the payload's transfers, launch arguments) and the collaborators it owns, each handed what it
needs: each submission's CUDA graph is `capture` (host/backends/cuda/capture.py's Capture), one
launch alone and device bytes for the per-launch digests `digests` (host/backends/cuda/digests.py's
LaunchDigests), and what close frees `closers` (host/backends/cuda/teardown.py's Closers, one
object all of them add to).  Closing is host/backends/cuda/teardown.py's (a bounded wait for issued
work; what the GPU may still touch after that is never freed), the device check's timings are
host/backends/cuda/timing.py's.
"""
from __future__ import annotations

import time
import warnings

from coppelius.plan import launches as _launches
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging.views import StagingViews, poison

from coppelius.backends.cuda import teardown as cuda_teardown
from coppelius.backends.cuda import timing as cuda_timing
from coppelius.backends.cuda import ptx
from coppelius.backends.base import Backend, DeviceInfo
from coppelius.errors import BackendUnavailable
from coppelius.backends.cuda.capture import Capture
from coppelius.backends.cuda.digests import LaunchDigests
from coppelius.driver.calls import ReleaseWarning
from coppelius.driver.device import Device, DeviceBuffer, MappedRegion, memcpy_dtod, memcpy_dtoh, \
    memcpy_htod, memset_d8
from coppelius.driver.stream import Stream

DRAIN_TIMEOUT_S = 10.0      # close waits this long for issued work before leaving memory to exit
REFUSALS_SHOWN = 4          # kernels named in a refusal; the rest are counted
SHARED_HINT = ("the sm_80 kernels need up to 73,728 B of shared memory per block: an A100 (cc 8.0), "
               "an H100/H200 (cc 9.0) and the cc 8.6/8.9/12.0 GPUs (about 99 KiB) allow that "
               "(README: which GPUs run)")
THREADS_HINT = ("the JIT gave it more registers than that many threads can hold; "
                "`coppelius doctor` lists the registers per function")


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


def _capture_attribute(name: str) -> property:
    """The capture's attribute `name`, read and set through the backend too: the device check
    (tools/gpu_check) sets the capture options and reads what the last capture reports there."""
    return property(lambda self: getattr(self.capture, name),
                    lambda self, value: setattr(self.capture, name, value),
                    doc=f"Capture.{name} (host/backends/cuda/capture.py)")


class CudaBackend(Backend):
    name = "cuda"
    code = R.BACKEND_CUDA

    # the capture options (read at each `instantiate`) and what the last capture reports
    pdl = _capture_attribute("pdl")
    one_lane = _capture_attribute("one_lane")
    noop_side_lane = _capture_attribute("noop_side_lane")
    priority = _capture_attribute("priority")
    pdl_refused = _capture_attribute("pdl_refused")
    programmatic_edges = _capture_attribute("programmatic_edges")
    priority_range = _capture_attribute("priority_range")
    priority_note = _capture_attribute("priority_note")
    lane_priorities = _capture_attribute("lane_priorities")

    def __init__(self, profile, device: Device | None = None, pdl: bool = True,
                 one_lane: bool = False, noop_side_lane: bool = False, ordinal: int = 0):
        """Capture options (read at each `instantiate`; a run uses the defaults): `pdl`: the
        launches the plan allows get programmatic edges to their lane's previous launch
        (plan/launches/graph.py `programmatic`) where the loaded kernel was built to wait for it
        (sm_90a); False captures every edge in full.  `one_lane`: every launch on one stream in
        list order (a valid order: every edge points back), the side lane's overlap given up.
        `noop_side_lane`: each side-lane launch replaced by one launch of the no-op kernel
        (capture.NOOP_PTX), its edges kept: the graph without the side lane's work.  The last two
        are the device check's experiments (tools/gpu_check/launches.py) and change the results.
        `ordinal`: which visible device to open when `device` is not given (`--device`)."""
        super().__init__(profile)
        self.closers = cuda_teardown.Closers()
        self.capture: Capture | None = None         # made once the kernels are loaded
        self.digests: LaunchDigests | None = None
        self._snapshot: DeviceBuffer | None = None
        self._copy_stream: Stream | None = None
        self.dev = device or Device(ordinal)
        self.closers.append(self.dev)
        self._abandoned: str | None = None
        self.left_to_exit: list = []    # what close() did not free (the GPU may still touch it)
        try:
            self.target = choose_target(self.dev.compute_capability)
            self.manifest = ptx.Manifest.load(profile.name, self.target)
            # every module JIT-loaded and its functions' attributes read before any allocation
            t = time.perf_counter()
            self.kernels = self.manifest.kernels(self.closers)
            self.jit_s = time.perf_counter() - t
            refuse_unfit(self.kernels, self.dev)
            for k in self.kernels.values():
                k.opt_in_shared()
            self.region = self.closers.append(MappedRegion(L.REGION_BYTES))
            poison(self.region.array)
            self.staging = StagingViews(self.region.array, profile)
            self.allocate_buffers()
            self._submissions = _launches.submissions(profile)
            self.capture = Capture(self.dev.stream, self._submissions, self.packed, self.closers,
                                   pdl, one_lane, noop_side_lane)
            self.digests = LaunchDigests(self.dev, self.buffers, self.capture, self.manifest,
                                         self.closers)
        except BaseException:
            self.close()
            raise

    def device(self) -> DeviceInfo:
        return DeviceInfo(self.dev.name, self.dev.compute_capability, self.dev.driver_version,
                          self.target)

    def gpu_identity(self):
        return self.dev.identity

    def _alloc(self, spec, fill: int) -> DeviceBuffer:
        b = self.closers.append(DeviceBuffer(spec.nbytes))
        memset_d8(b.ptr, fill, spec.nbytes, self.dev.stream)
        return b

    # ---- payload through the transfer window (synchronous: the window is reused per chunk;
    # bounds checked by the base)
    def _upload_chunk(self, offset: int, nbytes: int) -> None:
        memcpy_htod(self.buffers["pmv"].ptr + offset, self.region.host_ptr + L.TRANSFER_WINDOW,
                    nbytes, self.dev.stream)
        self.dev.synchronize()

    def _download_chunk(self, offset: int, nbytes: int) -> None:
        memcpy_dtoh(self.region.host_ptr + L.TRANSFER_WINDOW, self.buffers["pmv"].ptr + offset,
                    nbytes, self.dev.stream)
        self.dev.synchronize()

    # ---- snapshot for publication while training goes on (one extra payload on the device)
    def snapshot(self) -> None:
        if self._snapshot is None:
            self._snapshot = self.closers.append(DeviceBuffer(self.buffers["pmv"].nbytes))
            self._copy_stream = self.closers.append(Stream())
        # on the submission stream, after the update that was just fenced; ~0.25 ms for 692 MB
        memcpy_dtod(self._snapshot.ptr, self.buffers["pmv"].ptr, self._snapshot.nbytes,
                    self.dev.stream)
        self.dev.synchronize()

    def _download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        self.dev.make_current()
        memcpy_dtoh(self.region.host_ptr + L.TRANSFER_WINDOW, self._snapshot.ptr + offset,
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
            values.append(self.closers.append(DeviceBuffer(size * programs)).ptr if size else 0)
        values += [0] * (len(kernel.param_types) - len(values))
        return kernel, kernel.pack(values)

    # ---- submissions: the capture's graphs (host/backends/cuda/capture.py)
    def instantiate(self, t_base: int) -> None:
        self.capture.instantiate(t_base)

    def issue(self, submission: int) -> None:
        self.capture.issue(submission)

    def priority_report(self, submission: int) -> dict:
        return self.capture.priority_report(submission)

    # ---- per-launch digests: the primitives are host/backends/cuda/digests.py's
    def run_launch(self, submission: int, index: int) -> None:
        self.digests.run_launch(submission, index)

    def code_sha256(self, launch) -> str:
        return self.digests.code_sha256(launch)

    def _read_buffer(self, name: str, offset: int, nbytes: int):
        return self.digests.read_buffer(name, offset, nbytes)

    def _write_buffer(self, name: str, offset: int, data) -> None:
        self.digests.write_buffer(name, offset, data)

    def save_buffers(self) -> dict:
        return self.digests.save_buffers()

    def restore_buffers(self, saved: dict) -> None:
        self.digests.restore_buffers(saved)

    def free_saved(self, saved: dict) -> None:
        self.digests.free_saved(saved)

    # ---- the device check's timings (host/backends/cuda/timing.py)
    def time_submission(self, submission: int, repeats: int,
                        lead: int = cuda_timing.TIMING_LEAD_MIN) -> cuda_timing.SubmissionTiming:
        """The launch list outside its graph and the graph (host/backends/cuda/timing.py)."""
        return cuda_timing.time_submission(self.capture, self.check, submission, repeats, lead)

    def time_graph(self, submission: int, repeats: int) -> list:
        """The graph as captured now, replay by replay (host/backends/cuda/timing.py), µs."""
        return cuda_timing.time_graph(self.capture, self.check, submission, repeats)

    def time_alone(self, submission: int, indices, repeats: int) -> list:
        """Chosen launches each by itself on an idle stream (host/backends/cuda/timing.py), µs."""
        return cuda_timing.time_alone(self.capture, self.check, submission, indices, repeats)

    def check(self) -> bool:
        return self.dev.query()

    def synchronize(self) -> None:
        self.dev.synchronize()

    # ---- teardown (host/backends/cuda/teardown.py)
    def abandon(self, reason: str) -> None:
        """Something may still touch device memory or staging: close() frees nothing."""
        self._abandoned = self._abandoned or reason

    def close(self) -> None:
        """Graphs, then every allocation in reverse order, once the streams are idle; a failure is
        reported, never raised.  Streams still busy after DRAIN_TIMEOUT_S (a fence timeout, a hung
        kernel) or a thread still using staging: nothing is freed, process exit frees it."""
        capture = self.capture
        if not self.closers and not (capture is not None and capture.graphs):
            return
        side = capture.side_stream if capture is not None else None
        streams = [s for s in (self.dev.stream, self._copy_stream, side) if s is not None]
        if self._abandoned is None and not cuda_teardown.drained(streams, DRAIN_TIMEOUT_S):
            self._abandoned = f"the GPU is still busy {DRAIN_TIMEOUT_S:g} s after the run"
        graphs = capture.take_graphs() if capture is not None else []
        if self._abandoned is not None:
            warnings.warn(f"cuda backend: {self._abandoned}: device memory, the mapped staging "
                          "region, the modules and the context are left for process exit to free",
                          ReleaseWarning, stacklevel=2)
            self.left_to_exit += graphs + self.closers.take()   # referenced, never freed
        else:
            cuda_teardown.free(graphs, self.closers.take())
