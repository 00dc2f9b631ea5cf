"""The cuda backend: the plan's launch lists on an NVIDIA GPU through the driver API.

Only runtime dependencies (cuda-python, numpy, cffi): no Triton, no torch.  PTX comes from
`kernels_ptx/<profile>/<target>/` (the target chosen by compute capability: 9.0 → sm_90a,
≥ 8.0 → sm_80, else refused); the driver's JIT loads it.  Staging is the 8 MiB pinned region mapped
into the device; every device buffer of plan/buffers.py is one cuMemAlloc.  Each submission is
captured once into a CUDA graph and issued by one cuGraphLaunch.
"""
from __future__ import annotations

import warnings

from plan import launches as _launches
from staging import layout as SL
from staging import records as R
from staging.views import StagingViews, poison

from . import driver as drv
from . import ptx
from .backend import Backend, BackendUnavailable, DeviceInfo


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

    def __init__(self, profile, device: drv.Device | None = None):
        super().__init__(profile)
        self._closers = []
        self._graphs: list[drv.Graph] = []
        self._snapshot: drv.DeviceBuffer | None = None
        self._copy_stream: drv.Stream | None = None
        self.dev = device or drv.Device()
        self._closers.append(self.dev)
        try:
            self.target = choose_target(self.dev.compute_capability)
            self.manifest = ptx.Manifest.load(profile.name, self.target)
            self.region = drv.MappedRegion(SL.REGION_BYTES)
            self._closers.append(self.region)
            poison(self.region.array)
            self.staging = StagingViews(self.region.array, profile)
            self.allocate_buffers()
            self.kernels = self.manifest.kernels(self._closers)
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
        for g in self._graphs:
            g.close()
        self._graphs = []
        self._params = []                       # kept alive as long as the graphs
        for sub in self._submissions:
            launches = [self.packed(launch, t_base) + (launch.grid,) for launch in sub.launches]
            self._params.append(launches)

            def record(stream, launches=launches):
                for kernel, params, grid in launches:
                    kernel.launch(stream, grid, params)

            self._graphs.append(drv.Graph(self.dev, record))

    def issue(self, submission: int) -> None:
        self._graphs[submission].launch()

    def check(self) -> bool:
        return self.dev.query()

    def synchronize(self) -> None:
        self.dev.synchronize()

    def close(self) -> None:
        """Graphs, then every allocation in reverse order; a failure is reported, never raised."""
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
