"""`coppelius doctor`: driver, device, compute capability, PTX target, staging mapping, smoke launch.

It opens the cuda backend exactly as a run does (`CudaBackend`: device, mapped staging, poisoned
buffers, every module JIT-loaded) and reports each stage, so what doctor passes a run gets.
"""
from __future__ import annotations

import sys
import time

ORDER = 80


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the driver, the device, the PTX target and a smoke launch")
    p.add_argument("--profile", default="coppelius", help="whose PTX to load (default coppelius)")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.set_defaults(func=run)


class Report:
    """The checks in order: each a name, a value and whether it passed; printed as it goes (or
    as one JSON object at the end with --json)."""

    def __init__(self, as_json: bool):
        from rich.console import Console
        self.console = None if as_json else Console()
        self.checks: list[dict] = []
        self.ok = True

    def line(self, name: str, value: str, good: bool = True) -> None:
        self.ok &= good
        self.checks.append({"name": name, "value": value, "ok": good})
        if self.console is not None:
            mark = "[green]  ok[/green]" if good else "[red]FAIL[/red]"
            self.console.print(f"{mark}  {name:<20} {value}", highlight=False)

    def note(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def finish(self, **extra) -> int:
        if self.console is None:
            import json
            print(json.dumps({"ok": self.ok, "checks": self.checks, **extra}, indent=1))
        else:
            self.console.print("all checks passed" if self.ok else "[red]some checks failed[/red]")
        return 0 if self.ok else 1


def _smoke_launch(backend, report: Report) -> None:
    """The release kernel writes the doorbell's value into a semaphore record with a timestamp."""
    from plan import launches
    from staging import layout as L
    manifest, views = backend.manifest, backend.staging
    key = next(k for k, e in manifest.entries.items() if e.entry == launches.RELEASE)
    release = backend.kernels[key]
    slot = L.semaphore_slot(0) + L.SLOT_FINAL_RELEASE
    seq = 0x5EED
    views.doorbell[0] = seq
    params = release.pack([backend.region.device_ptr + L.DOORBELL, backend.region.device_ptr + slot]
                          + [0] * (len(release.param_types) - 2))
    t = time.perf_counter()
    release.launch(backend.dev.stream, (1, 1, 1), params)
    backend.synchronize()
    dt = time.perf_counter() - t
    rec = views.semaphores[0]
    good = int(rec["final_payload"]) == seq and int(rec["final_timestamp"]) != 0
    report.line("smoke launch", f"release wrote payload {int(rec['final_payload']):#x}, device time "
                f"{int(rec['final_timestamp'])} ns, {dt * 1e6:.0f} µs round trip", good)


def run(args) -> int:
    # imports here, not at the top: every subcommand module is imported to build --help
    import warnings

    from plan import profiles
    from staging import layout as L

    from . import __version__
    from . import driver as drv
    from . import ptx
    from .backend import BackendUnavailable, DeviceError
    from .backend_cuda import CudaBackend
    from .errors import UserError

    report = Report(args.json)
    line = report.line

    try:
        profile = profiles.get(args.profile)
    except KeyError as e:
        raise UserError(str(e.args[0])) from None
    line("coppelius", f"{__version__}, python {sys.version.split()[0]}")
    try:
        import cuda.bindings
        line("cuda-python", getattr(cuda.bindings, "__version__", "?"))
    except ImportError as e:
        line("cuda-python", f"not installed ({e})", False)
        return report.finish()
    for target in ("sm_90a", "sm_80"):
        try:
            m = ptx.Manifest.load(profile.name, target)
            problems = m.verify()
            line(f"PTX {profile.name}/{target}",
                 f"{len(m.entries)} entries, ISA {m.ptx_isa}" + (f"; {problems[0]}" if problems else ""),
                 not problems)
        except UserError as e:
            line(f"PTX {profile.name}/{target}", str(e), False)
    try:
        dev = drv.Device()
    except BackendUnavailable as e:
        line("driver", e.message, False)
        report.note(f"no GPU here: {e.hint}")
        return report.finish(hint=e.hint)
    v = dev.driver_version
    line("driver", f"CUDA {v // 1000}.{(v % 1000) // 10} ({v})")
    line("device", f"{dev.name}, compute capability {dev.major}.{dev.minor}")
    t = time.perf_counter()
    try:
        backend = CudaBackend(profile, device=dev)      # owns dev from here on, closes it
    except (UserError, DeviceError) as e:
        line("cuda backend", str(e), False)
        return report.finish()
    with warnings.catch_warnings(record=True) as released:
        warnings.simplefilter("always", drv.ReleaseWarning)
        try:
            line("PTX target", backend.target)
            region = backend.region
            line("staging", f"{L.REGION_BYTES >> 20} MiB pinned, host {region.host_ptr:#x} → "
                 f"device {region.device_ptr:#x}, can map host memory: {bool(dev.can_map_host)}",
                 bool(dev.can_map_host))
            line("backend open", f"{len(backend.kernels)} kernels JIT-loaded, {len(backend.buffers)} "
                 f"buffers poisoned, {time.perf_counter() - t:.2f} s")
            _smoke_launch(backend, report)
        except Exception as e:  # a doctor reports; the traceback is for internal errors only
            line("error", f"{type(e).__name__}: {e}", False)
        finally:
            backend.close()
        for w in released:
            line("release", str(w.message), False)
    return report.finish()
