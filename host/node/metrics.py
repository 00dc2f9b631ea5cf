"""The verdicts as Prometheus metrics (docs/NODE.md, "Metrics"): one file in Prometheus' text
exposition format, for node exporter's textfile collector, so that a fleet's GPU health is one
scrape away and Grafana and alert rules see it beside NVIDIA's DCGM exporter.

`from_report` reads a `coppelius node` report (docs/NODE.md), `coppelius.node.gathered` result
files of the job array or the node check; both give `Gpu` rows, and `write` puts them in a registry
of `prometheus-client` (the `metrics` extra) and writes it with the client's `write_to_textfile`:
a temporary file beside the target renamed over it, so a scrape never reads half a file and a
failed write leaves the last complete one (its `coppelius_gpu_last_run_timestamp_seconds` then
goes stale, which the shipped alert rules watch).  The text is the client's, never formatted
here.

Every series is labelled `Hostname`, `index`, `UUID`, `pci_bus_id`: DCGM exporter's names where
they mean the same (`Hostname`, `UUID`, `pci_bus_id`), so a rule can join on `UUID`; `index` is
CUDA's ordinal under CUDA_VISIBLE_DEVICES (the report's `index`), which is not DCGM's `gpu`
(NVML's numbering), hence its own name.  A value the run did not give (no NVML, no timed update,
no soak) is absent, never invented."""
from __future__ import annotations

import os
from dataclasses import dataclass

from coppelius.staging import paths
from coppelius.staging.errors import UserError

from coppelius.extras import install_command
from coppelius.node.verdicts import ERROR, FAIL, PASS, TIE
from coppelius.telemetry import READINGS

EXTRA = "metrics"                       # pyproject's extra that brings prometheus-client
WHAT = "metrics file"                   # how a refusal names the path
LABELS = ("Hostname", "index", "UUID", "pci_bus_id")
VERDICTS = (PASS, FAIL, TIE, ERROR)
HZ_PER_MHZ = 1e6                        # NVML reports clocks in MHz; Prometheus' base unit is Hz
US_PER_S = 1e6

VERDICT = "coppelius_gpu_verdict"
LAST_RUN = "coppelius_gpu_last_run_timestamp_seconds"
DURATION = "coppelius_gpu_run_duration_seconds"
HOST_GAP = "coppelius_gpu_host_gap_median_seconds"
RUN_INFO = "coppelius_gpu_run"                              # written with the client's "_info"
FIRST_DIFFERENCE = "coppelius_gpu_first_difference"         # "_info"
FIRST_KERNEL = "coppelius_gpu_first_divergent_kernel"       # "_info"
SOAK_REPETITIONS = "coppelius_gpu_soak_repetitions"
SOAK_TRANSIENT = "coppelius_gpu_soak_transient_faults"
TELEMETRY_SAMPLES = "coppelius_gpu_telemetry_samples"
THROTTLE = "throttle_reasons"           # the reading OR-ed over every sample (any throttle counts)
# NVML reading (coppelius.telemetry.READINGS) → metric, kind, scale, help
NVML = {
    "temperature_c": ("coppelius_gpu_temperature_celsius", "gauge", 1.0,
                      "GPU temperature (NVML), at the run's last sample"),
    "power_w": ("coppelius_gpu_power_watts", "gauge", 1.0,
                "GPU power draw (NVML), at the run's last sample"),
    "sm_clock_mhz": ("coppelius_gpu_sm_clock_hertz", "gauge", HZ_PER_MHZ,
                     "SM clock (NVML), at the run's last sample"),
    "memory_clock_mhz": ("coppelius_gpu_memory_clock_hertz", "gauge", HZ_PER_MHZ,
                         "Memory clock (NVML), at the run's last sample"),
    THROTTLE: ("coppelius_gpu_clock_throttle_reasons", "gauge", 1.0,
               "NVML clocks-event (throttle) reason bit mask, OR-ed over the run's samples"),
    "ecc_volatile_corrected": ("coppelius_gpu_ecc_volatile_corrected_errors", "counter", 1.0,
                               "Volatile corrected ECC errors since the driver loaded (NVML)"),
    "ecc_volatile_uncorrected": ("coppelius_gpu_ecc_volatile_uncorrected_errors", "counter",
                                 1.0, "Volatile uncorrected ECC errors since the driver loaded "
                                      "(NVML)"),
    "retired_pages_pending": ("coppelius_gpu_retired_pages_pending", "gauge", 1.0,
                              "1 when a page retirement waits for a reset (NVML)"),
    "row_remap_pending": ("coppelius_gpu_row_remap_pending", "gauge", 1.0,
                          "1 when a row remap waits for a reset (NVML)"),
    "row_remap_failure": ("coppelius_gpu_row_remap_failure", "gauge", 1.0,
                          "1 when a row remap failed (NVML)"),
}


class MetricsRefused(UserError):
    """The metrics cannot be written (no prometheus-client, a path that cannot become a file, a
    full disk): one line and a hint.  It never changes a verdict."""


@dataclass(frozen=True)
class Gpu:
    """One GPU's verdict and what its run measured, as the metrics show it."""
    host: str
    index: str                          # "" where the ordinal is not known (a gathered result)
    uuid: str                           # "" on the interpreter, or where no result says
    pci_bus_id: str
    model: str
    profile: str
    backend: str
    steps: int | None
    verdict: str
    first_difference: dict | None = None
    kernel: dict | None = None
    soak: dict | None = None
    ended_unix_s: float | None = None
    wall_s: float | None = None
    host_gap_median_s: float | None = None
    readings: tuple = ()                # NVML samples in order, each a dict of READINGS

    @property
    def labels(self) -> list[str]:
        return [self.host, self.index, self.uuid, self.pci_bus_id]


def from_report(report: dict) -> list[Gpu]:
    """The rows of a `coppelius node` report (docs/NODE.md)."""
    from coppelius.plan import profiles
    steps = report["steps"] or profiles.get(report["profile"]).steps
    out = []
    for g in report["gpus"]:
        gap_us = g.get("host_gap_median_us")
        process = g["process"]
        out.append(Gpu(
            host=report["host"], index=str(g["index"]), uuid=g["uuid"],
            pci_bus_id=g["pci_bus_id"], model=g["name"], profile=report["profile"],
            backend=report["backend"], steps=steps, verdict=g["verdict"],
            first_difference=g["first_difference"], kernel=g.get("kernel"), soak=g.get("soak"),
            ended_unix_s=process.get("ended_unix_s"), wall_s=process["wall_s"],
            host_gap_median_s=None if gap_us is None else gap_us / US_PER_S,
            readings=tuple({k: s.get(k) for k in READINGS} for s in g["telemetry"] or ())))
    return out


def _latest(readings: tuple, key: str):
    """The latest sample's value of a reading that a sample has (NVML may have answered null)."""
    values = [r[key] for r in readings if r.get(key) is not None]
    if not values:
        return None
    if key == THROTTLE:
        mask = 0
        for v in values:
            mask |= int(v)
        return mask
    return values[-1]


class _Collector:
    """A prometheus-client collector over the rows (the client's way of exporting values another
    system measured): every family, each GPU's samples in it."""

    def __init__(self, gpus: list[Gpu]):
        self.gpus = gpus

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            InfoMetricFamily)

        def gauge(name, text, extra=()):
            return GaugeMetricFamily(name, text, labels=[*LABELS, *extra])

        verdict = gauge(VERDICT, "1 for the GPU's verdict of its last run (PASS: bit for bit the "
                        "reference; FAIL; TIE: no majority; ERROR: could not run), 0 for the "
                        "other states", ("verdict",))
        scalars = {
            LAST_RUN: gauge(LAST_RUN, "Unix time the GPU's last checked run ended"),
            DURATION: gauge(DURATION, "Wall seconds of the GPU's last checked run"),
            HOST_GAP: gauge(HOST_GAP, "Median host gap before an update issue (the previous "
                            "issue's fence to the issue) in the GPU's last run"),
            SOAK_REPETITIONS: gauge(SOAK_REPETITIONS, "Repetitions of the soaked update step"),
            SOAK_TRANSIENT: gauge(SOAK_TRANSIENT, "Soak repetitions whose digests differed "
                                  "from the first (transient faults)"),
            TELEMETRY_SAMPLES: gauge(TELEMETRY_SAMPLES, "NVML samples taken of the GPU in its "
                                     "last run (0: no NVML readings follow)"),
        }
        run = InfoMetricFamily(RUN_INFO, "What the GPU's last checked run was",
                               labels=[*LABELS, "modelName", "profile", "backend", "steps"])
        difference = InfoMetricFamily(FIRST_DIFFERENCE, "Where a FAILed GPU's result first "
                                      "differs from the reference", labels=LABELS)
        kernel = InfoMetricFamily(FIRST_KERNEL, "The first launch of the digested update whose "
                                  "writes differ from a passing GPU's (a FAIL with --digests)",
                                  labels=LABELS)
        nvml = {key: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                    name, text, labels=LABELS) for key, (name, kind, _, text) in NVML.items()}
        for g in self.gpus:
            lab = g.labels
            for state in VERDICTS:
                verdict.add_metric([*lab, state], 1.0 if g.verdict == state else 0.0)
            if g.profile:                   # what ran, where a result or report says
                run.add_metric(lab, {"modelName": g.model, "profile": g.profile,
                                     "backend": g.backend,
                                     "steps": "" if g.steps is None else str(g.steps)})
            values = {LAST_RUN: g.ended_unix_s, DURATION: g.wall_s,
                      HOST_GAP: g.host_gap_median_s, TELEMETRY_SAMPLES: len(g.readings)}
            if g.soak and "repetitions" in g.soak:
                values[SOAK_REPETITIONS] = g.soak["repetitions"]
                values[SOAK_TRANSIENT] = len(g.soak["transient"])
            for name, value in values.items():
                if value is not None:
                    scalars[name].add_metric(lab, float(value))
            if g.verdict == FAIL and g.first_difference:
                fd = g.first_difference
                difference.add_metric(lab, {"section": str(fd["section"]),
                                            "where": str(fd["where"])})
            if g.verdict == FAIL and (g.kernel or {}).get("launch") is not None:
                k = g.kernel
                kernel.add_metric(lab, {"launch": str(k["launch"]), "label": k["label"],
                                        "kernel": k["kernel"], "divergence": k["verdict"]})
            for key, (_, _, scale, _) in NVML.items():
                value = _latest(g.readings, key)
                if value is not None:
                    nvml[key].add_metric(lab, float(value) * scale)
        # a family no GPU has a value of is left out, not written as a bare HELP and TYPE
        for family in (verdict, run, *scalars.values(), difference, kernel, *nvml.values()):
            if family.samples:
                yield family


def _client():
    try:
        import prometheus_client
    except ImportError:
        raise MetricsRefused("metrics need prometheus-client, which is not installed",
                             install_command(EXTRA)) from None
    return prometheus_client


def registry(gpus: list[Gpu]):
    """A prometheus-client CollectorRegistry holding the rows; two rows with the same labels
    (which Prometheus would reject as one series twice) are refused."""
    client = _client()
    seen = {}
    for g in gpus:
        key = tuple(g.labels)
        if key in seen:
            shown = ", ".join(f"{k}={v!r}" for k, v in zip(LABELS, key))
            raise MetricsRefused(f"two GPUs would be one series ({shown})",
                                 "give each result its host and index "
                                 "(coppelius metrics --host NAME --gpu INDEX RESULT)")
        seen[key] = g
    out = client.CollectorRegistry(auto_describe=False)
    out.register(_Collector(gpus))
    return out


def check(path) -> None:
    """Before any work: prometheus-client is there and `path` can become a regular file (its
    directory exists; it is no directory, FIFO or device)."""
    _client()
    paths.check_output(path, WHAT, overwrite=True, exists_hint=None, cls=MetricsRefused)


def write(gpus: list[Gpu], path) -> None:
    """The rows written to `path` with prometheus-client's write_to_textfile (atomic: a temporary
    beside it, renamed); MetricsRefused names the path and the errno where it cannot be."""
    client = _client()
    check(path)
    reg = registry(gpus)
    with paths.refusing(WHAT, path, "write", MetricsRefused):
        client.write_to_textfile(os.fspath(path), reg)
