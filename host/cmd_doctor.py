"""`coppelius doctor`: driver, device, compute capability, PTX target, staging mapping, smoke launch."""
from __future__ import annotations

import sys
import time

ORDER = 80


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the driver, the device, the PTX target and a smoke launch")
    p.add_argument("--profile", default="coppelius", help="whose PTX to load (default coppelius)")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np
    from rich.console import Console

    from plan import profiles
    from staging import layout as L
    from staging.views import StagingViews, poison

    from . import __version__
    from . import driver as drv
    from . import ptx
    from .backend import BackendUnavailable
    from .backend_cuda import choose_target
    from .errors import UserError

    console = Console()
    ok = True

    def line(name, value, good=True):
        nonlocal ok
        ok &= good
        mark = "[green]  ok[/green]" if good else "[red]FAIL[/red]"
        console.print(f"{mark}  {name:<20} {value}", highlight=False)

    profile = profiles.get(args.profile)
    line("coppelius", f"{__version__}, python {sys.version.split()[0]}")
    try:
        import cuda.bindings
        line("cuda-python", getattr(cuda.bindings, "__version__", "?"))
    except ImportError as e:
        line("cuda-python", f"not installed ({e})", False)
        return 1
    for target in ("sm_90a", "sm_80"):
        try:
            m = ptx.Manifest.load(profile.name, target)
            problems = m.verify()
            line(f"PTX {profile.name}/{target}",
                 f"{len(m.entries)} entries, ISA {m.ptx_version}" + (f"; {problems[0]}" if problems else ""),
                 not problems)
        except UserError as e:
            line(f"PTX {profile.name}/{target}", str(e), False)
    try:
        dev = drv.Device()
    except BackendUnavailable as e:
        line("driver", e.message, False)
        console.print(f"no GPU here: {e.hint}")
        return 1
    closers = [dev]
    try:
        v = dev.driver_version
        line("driver", f"CUDA {v // 1000}.{(v % 1000) // 10} ({v})")
        line("device", f"{dev.name}, compute capability {dev.major}.{dev.minor}")
        try:
            target = choose_target(dev.compute_capability)
            line("PTX target", target)
        except BackendUnavailable as e:
            line("PTX target", e.message, False)
            return 1
        region = drv.MappedRegion(L.REGION_BYTES)
        closers.append(region)
        poison(region.array)
        views = StagingViews(region.array, profile)
        line("staging", f"{L.REGION_BYTES >> 20} MiB pinned, host {region.host_ptr:#x} → device "
             f"{region.device_ptr:#x}, can map host memory: {bool(dev.can_map_host)}",
             bool(dev.can_map_host))
        manifest = ptx.Manifest.load(profile.name, target)
        t = time.perf_counter()
        kernels = manifest.kernels(closers)
        line("module load (JIT)", f"{len(kernels)} kernels in {time.perf_counter() - t:.2f} s")
        # smoke launch: the release kernel writes the doorbell's value into a semaphore record
        from plan import launches
        release = next(k for key, k in kernels.items() if manifest.entries[key].entry == launches.RELEASE)
        slot = L.semaphore_slot(0) + L.SLOT_FINAL_RELEASE
        seq = 0x5EED
        views.doorbell[0] = seq
        params = release.pack([region.device_ptr + L.DOORBELL, region.device_ptr + slot]
                              + [0] * (len(release.param_types) - 2))
        t = time.perf_counter()
        release.launch(dev.stream, (1, 1, 1), params)
        dev.synchronize()
        dt = time.perf_counter() - t
        rec = views.semaphores[0]
        good = int(rec["final_payload"]) == seq and int(rec["final_timestamp"]) != 0
        line("smoke launch", f"release wrote payload {int(rec['final_payload']):#x}, device time "
             f"{int(rec['final_timestamp'])} ns, {dt * 1e6:.0f} µs round trip", good)
    except Exception as e:      # a doctor reports; the traceback is for internal errors only
        line("error", f"{type(e).__name__}: {e}", False)
    finally:
        for c in reversed(closers):
            try:
                c.close()
            except Exception:
                pass
    console.print("all checks passed" if ok else "[red]some checks failed[/red]")
    return 0 if ok else 1
