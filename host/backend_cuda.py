"""The cuda backend: the plan's launch lists on an NVIDIA GPU through the driver API.

Only runtime dependencies (cuda-python, numpy, cffi): no Triton, no torch.  PTX comes from
`kernels_ptx/<profile>/<target>/` (the target chosen by compute capability: 9.0 → sm_90a,
≥ 8.0 → sm_80, else refused); the driver's JIT loads it.  Staging is the 8 MiB pinned region mapped
into the device; every device buffer of plan/buffers.py is one cuMemAlloc.  Each submission is
captured once into a CUDA graph and issued by one cuGraphLaunch.
"""
from __future__ import annotations

from plan import launches as _launches
from plan.buffers import buffers as _buffers
from staging import layout as SL
from staging import records as R
from staging.views import StagingViews, poison

from . import driver as drv
from . import ptx
from .backend import Backend, BackendUnavailable, DeviceError, DeviceInfo


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
        self.profile = profile
        self._closers = []
        self.dev = device or drv.Device()
        self._closers.append(self.dev)
        try:
            self.target = choose_target(self.dev.compute_capability)
            self.manifest = ptx.Manifest.load(profile.name, self.target)
            self.region = drv.MappedRegion(SL.REGION_BYTES)
            self._closers.append(self.region)
            poison(self.region.array)
            self.staging = StagingViews(self.region.array, profile)
            self.buffers: dict[str, drv.DeviceBuffer] = {}
            for name, spec in _buffers(profile).items():
                b = drv.DeviceBuffer(spec.nbytes)
                self._closers.append(b)
                # poison: NaN in every float buffer, so a kernel reading an unwritten value shows
                drv.memset_d8(b.ptr, 0xFF, spec.nbytes, self.dev.stream)
                self.buffers[name] = b
            self.dev.synchronize()
            self.kernels = self.manifest.kernels(self._closers)
            self._submissions = _launches.submissions(profile)
            self._graphs: list[drv.Graph] = []
        except BaseException:
            self.close()
            raise

    def device(self) -> DeviceInfo:
        return DeviceInfo(self.dev.name, self.dev.compute_capability, self.dev.driver_version,
                          self.target)

    # ---- payload through the transfer window (synchronous: the window is reused per chunk)
    def _check_chunk(self, offset: int, nbytes: int) -> None:
        total = self.buffers["pmv"].nbytes
        if nbytes > SL.TRANSFER_WINDOW_BYTES or offset < 0 or offset + nbytes > total:
            raise ValueError(f"chunk [{offset}, {offset + nbytes}) outside the payload ({total} "
                             "bytes) or larger than the transfer window")

    def upload_chunk(self, offset: int, nbytes: int) -> None:
        self._check_chunk(offset, nbytes)
        drv.memcpy_htod(self.buffers["pmv"].ptr + offset, self.region.host_ptr + SL.TRANSFER_WINDOW,
                        nbytes, self.dev.stream)
        self.dev.synchronize()

    def download_chunk(self, offset: int, nbytes: int) -> None:
        self._check_chunk(offset, nbytes)
        drv.memcpy_dtoh(self.region.host_ptr + SL.TRANSFER_WINDOW, self.buffers["pmv"].ptr + offset,
                        nbytes, self.dev.stream)
        self.dev.synchronize()

    # ---- snapshot for publication while training goes on (one extra payload on the device)
    def snapshot(self) -> None:
        if getattr(self, "_snapshot", None) is None:
            self._snapshot = drv.DeviceBuffer(self.buffers["pmv"].nbytes)
            self._closers.append(self._snapshot)
            self._copy_stream = self.dev.new_stream()
        # on the submission stream, after the update that was just fenced; ~0.25 ms for 692 MB
        drv.memcpy_dtod(self._snapshot.ptr, self.buffers["pmv"].ptr, self._snapshot.nbytes,
                        self.dev.stream)
        self.dev.synchronize()

    def download_snapshot_chunk(self, offset: int, nbytes: int) -> None:
        self._check_chunk(offset, nbytes)
        self.dev.make_current()
        drv.memcpy_dtoh(self.region.host_ptr + SL.TRANSFER_WINDOW, self._snapshot.ptr + offset,
                        nbytes, self._copy_stream)
        drv.check(drv.cu().cuStreamSynchronize(self._copy_stream), "cuStreamSynchronize")

    # ---- launch lists
    def resolve(self, arg, t_base: int):
        if isinstance(arg, _launches.BufferRef):
            return self.buffers[arg.buffer].ptr + arg.byte_offset
        if isinstance(arg, _launches.StagingRef):
            return self.region.device_ptr + arg.offset
        return self.scalar_value(arg, t_base)

    def packed(self, launch, t_base: int):
        kernel = self.kernels[launch.kernel]
        values = [self.resolve(a, t_base) for _, a in launch.args]
        # Triton's hidden trailing scratch pointers: null unless the kernel asked for scratch, then
        # per-program bytes × programs in the grid, as Triton's own launcher allocates
        programs = launch.grid[0] * launch.grid[1] * launch.grid[2]
        for size in getattr(kernel, "scratch", ()):
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
        if getattr(self, "_copy_stream", None) is not None:
            drv.cu().cuStreamDestroy(self._copy_stream)
            self._copy_stream = None
        for g in getattr(self, "_graphs", []):
            g.close()
        self._graphs = []
        for c in reversed(self._closers):
            try:
                c.close()
            except Exception:
                pass
        self._closers = []
