"""`coppelius doctor`: driver, device, compute capability, PTX target, staging mapping, every
module's functions as the driver reports them, smoke launch.

It opens the cuda backend exactly as a run does (`CudaBackend`: device, every module JIT-loaded and
checked against the device's limits, mapped staging, poisoned buffers) and reports each stage, so
what doctor passes a run gets.  `--json` prints one object: {"ok", "checks": [{"name", "value",
"ok"}], "modules": [{"file", "functions": [{"kernel", "entry", "registers", "threads",
"max_threads", "shared_dynamic", "shared_static", "local_bytes", "spill_stores", "spill_loads"}]}]}.
Spills come from the JIT's log, which is empty when the driver's compute cache served the module
(CUDA_CACHE_DISABLE=1 forces the JIT): then they are null and `local_bytes` is what is known.
"""
from __future__ import annotations

import sys
import time

from coppelius.cli.options import add_device_argument

ORDER = 80


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the driver, the device, the PTX target and a smoke launch")
    p.add_argument("--profile", default="coppelius", help="whose PTX to load (default coppelius)")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    add_device_argument(p)
    p.set_defaults(func=run)


class Report:
    """The checks in order: each a name, a value and whether it passed; printed as it goes (or
    as one JSON object at the end with --json)."""

    def __init__(self, as_json: bool):
        from coppelius.cli.console import report_console
        self.console = None if as_json else report_console()      # prints every value verbatim
        self.checks: list[dict] = []
        self.ok = True

    def line(self, name: str, value: str, good: bool = True) -> None:
        self.ok &= good
        self.checks.append({"name": name, "value": value, "ok": good})
        if self.console is not None:
            from coppelius.cli.console import styled
            mark = ("  ok", "green") if good else ("FAIL", "red")
            self.console.print(styled(mark, f"  {name:<20} {value}"))

    def note(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def modules(self, modules: list[dict]) -> None:
        """Per PTX file, what the driver reports for each function."""
        if self.console is None:
            return
        from rich.table import Table
        table = Table("module", "function", "regs", "threads (max)", "shared B (static)",
                      "local B", "spills st/ld B", box=None, pad_edge=False)
        for m in modules:
            for f in m["functions"]:
                spills = "—" if f["spill_stores"] is None else f"{f['spill_stores']}/{f['spill_loads']}"
                table.add_row(m["file"], f["entry"], str(f["registers"]),
                              f"{f['threads']} ({f['max_threads']})",
                              f"{f['shared_dynamic']:,} ({f['shared_static']:,})",
                              str(f["local_bytes"]), spills)
        self.console.print(table)

    def finish(self, **extra) -> int:
        if self.console is None:
            import json
            print(json.dumps({"ok": self.ok, "checks": self.checks, "modules": [], **extra},
                             indent=1))
        else:
            self.console.print("all checks passed" if self.ok else "some checks failed",
                               style=None if self.ok else "red")
        return 0 if self.ok else 1


def function_report(backend) -> list[dict]:
    """Per module (PTX file) of the manifest, what the driver reports for each of its functions."""
    by_file: dict[str, list[dict]] = {}
    for key, e in backend.manifest.entries.items():
        k = backend.kernels[key]
        a = k.attributes
        stores, loads = k.spills if k.spills is not None else (None, None)
        by_file.setdefault(e.file.name, []).append({
            "kernel": key, "entry": e.entry, "registers": a.registers, "threads": k.threads,
            "max_threads": a.max_threads, "shared_dynamic": k.shared,
            "shared_static": a.static_shared, "local_bytes": a.local_bytes,
            "spill_stores": stores, "spill_loads": loads})
    return [{"file": f, "functions": fns} for f, fns in sorted(by_file.items())]


def _smoke_launch(backend, report: Report) -> None:
    """The release kernel writes the doorbell's value into a semaphore record with a timestamp."""
    from coppelius.plan import launches
    from coppelius.staging import layout as L
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


def _installation_checks(profile, report: Report) -> bool:
    """Version, committed PTX, bindings; False when nothing further can be checked."""
    from coppelius import __version__
    from coppelius.driver import calls as drv
    from coppelius.backends.cuda import ptx
    from coppelius.staging.errors import UserError
    line = report.line
    line("coppelius", f"{__version__}, python {sys.version.split()[0]}")
    for target in ("sm_90a", "sm_80"):
        try:
            m = ptx.Manifest.load(profile.name, target)
            problems = m.verify()
            line(f"PTX {profile.name}/{target}",
                 f"{len(m.entries)} entries, ISA {m.ptx_isa}, in {m.directory}"
                 + (f"; {problems[0]}" if problems else ""), not problems)
        except UserError as e:
            line(f"PTX {profile.name}/{target}", str(e), False)
    bindings = drv.bindings_version()
    if bindings is None:
        line("cuda-bindings", "not installed", False)
        report.note(f"hint: {drv.BINDINGS_HINT}")
        return False
    try:
        drv.check_bindings_version(bindings)
    except drv.BindingsMismatch as e:
        line("cuda-bindings", str(e), False)
        return False
    line("cuda-bindings", bindings)
    return True


def _backend_checks(backend, report: Report, open_s: float) -> list[dict]:
    """What the opened backend reports: target, staging, every function, a smoke launch."""
    from coppelius.staging import layout as L
    line, dev, region = report.line, backend.dev, backend.region
    line("PTX target", backend.target)
    line("staging", f"{L.REGION_BYTES >> 20} MiB pinned, host {region.host_ptr:#x} → "
         f"device {region.device_ptr:#x}, can map host memory: {bool(dev.can_map_host)}",
         bool(dev.can_map_host))
    line("backend open", f"{len(backend.kernels)} kernels JIT-loaded in {backend.jit_s:.2f} s, "
         f"{len(backend.buffers)} buffers poisoned, {open_s:.2f} s in all")
    modules = function_report(backend)
    report.modules(modules)
    line("device limits", f"shared memory per block ≤ {dev.shared_optin:,} B (opt-in); "
         f"largest need {max(k.shared_per_block for k in backend.kernels.values()):,} B")
    _smoke_launch(backend, report)
    _graph_check(backend, report)
    _priority_check(backend, report)
    return modules


def _graph_check(backend, report: Report) -> None:
    """Capture the submissions' graphs as a run does: how many edges are programmatic, or the
    driver's refusal of them (the run then captures every edge in full: same bits, slower)."""
    import warnings

    from coppelius.backends.cuda.capture import ProgrammaticLaunchRefused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProgrammaticLaunchRefused)
        backend.instantiate(t_base=-1)
    edges = sum(backend.programmatic_edges.values())
    if backend.pdl_refused:
        report.line("graphs", f"captured with every edge full: the driver refused programmatic "
                    f"edges ({backend.pdl_refused})", False)
    else:
        report.line("graphs", f"{len(backend.programmatic_edges)} captured, {edges} launches "
                    "programmatic after their lane's previous one"
                    + ("" if edges else " (none: this target's PTX does not wait for them)"))


def _priority_check(backend, report: Report) -> None:
    """The device's stream priority range, the priority each lane's capture stream got (the plan's
    priority lane first: plan/launches/graph.PRIORITY_LANE), and the update graph's kernel nodes by
    priority as the driver reports them: each at its lane's, or the plan's priority is not in
    effect (a device without priorities: every lane at the default, a note)."""
    from collections import Counter

    from coppelius.plan.launches import graph as launch_graph
    from coppelius.plan import launches
    from coppelius.staging import layout as L
    r = backend.priority_report(L.SUBMISSION_UPDATE)
    names = {launches.MAIN_LANE: "main", launches.SIDE_LANE: "side"}

    def counts(xs) -> str:
        return ", ".join(f"{n} at {p}" for p, n in sorted(Counter(xs).items()))
    first = launch_graph.PRIORITY_LANE
    value = (f"range {r['range'][0]} (least) to {r['range'][1]} (greatest); "
             + ", ".join(f"{names[lane]} lane {p}" for lane, p in r["lanes"].items())
             + (f" (the plan's first: {names[first]})" if first is not None else "")
             + (f"; {r['note']}" if r["note"] else "")
             + f"; update graph's kernel nodes: {counts(r['nodes'])}")
    good = r["nodes"] == r["planned"]
    if not good:
        value += f" against {counts(r['planned'])} planned: the plan's priority is not in effect"
    report.line("stream priorities", value, good)


def run(args) -> int:
    # imports here, not at the top: every subcommand module is imported to build --help
    import warnings

    from coppelius.plan import profiles

    from coppelius.driver import calls as drv
    from coppelius.driver.device import Device
    from coppelius.errors import BackendUnavailable, DeviceError
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.staging.errors import UserError

    report = Report(args.json)
    line = report.line
    profile = profiles.get(args.profile)        # UnknownProfile is a refusal with a hint
    if not _installation_checks(profile, report):
        return report.finish()
    try:
        dev = Device(args.device)
    except drv.BindingsMismatch as e:              # bindings newer than the driver's CUDA
        line("cuda-bindings", str(e), False)
        return report.finish()
    except BackendUnavailable as e:
        line("driver", e.message, False)
        report.note(f"hint: {e.hint}")          # the hint says "no GPU here" itself
        return report.finish(hint=e.hint)
    v = dev.driver_version
    line("driver", f"CUDA {v // 1000}.{(v % 1000) // 10} ({v})")
    line("device", f"{dev.name}, compute capability {dev.major}.{dev.minor}")
    ident = dev.identity
    line("gpu", f"device {ident.ordinal}: {ident.uuid_text}, PCI bus id {ident.pci_bus_id}")
    t = time.perf_counter()
    try:
        backend = CudaBackend(profile, device=dev)      # owns dev from here on, closes it
    except (UserError, DeviceError) as e:
        line("cuda backend", str(e), False)
        return report.finish()
    modules: list[dict] = []
    with warnings.catch_warnings(record=True) as released:
        warnings.simplefilter("always", drv.ReleaseWarning)
        try:
            modules = _backend_checks(backend, report, time.perf_counter() - t)
        except Exception as e:  # a doctor reports; the traceback is for internal errors only
            line("error", f"{type(e).__name__}: {e}", False)
        finally:
            backend.close()
        for w in released:
            line("release", str(w.message), False)
    return report.finish(modules=modules)
