"""The node report: a versioned JSON object (docs/NODE.md, SCHEMA), the exit status, JUnit XML.

Exit status: 0 every GPU passed; 1 any FAIL or TIE; 2 could not run (any ERROR: a child's run was
refused, named in its reason)."""
from __future__ import annotations

import socket
import xml.etree.ElementTree as ET

from coppelius.forensics.summary import host_gaps_us, percentiles
from coppelius.node.verdicts import ERROR, PASS
from coppelius.results import telemetry_file
from coppelius.results.reader import ResultFileError, read

SCHEMA = "coppelius-node/1"           # docs/NODE.md: bump on any incompatible change
EXIT_PASS, EXIT_FAIL, EXIT_COULD_NOT_RUN = 0, 1, 2


def exit_code(gpus: list[dict]) -> int:
    verdicts = [g["verdict"] for g in gpus]
    if ERROR in verdicts:
        return EXIT_COULD_NOT_RUN
    return EXIT_PASS if all(v == PASS for v in verdicts) else EXIT_FAIL


def node_report(inv, children: list, verdicts: list[dict], telemetry=None) -> dict:
    """The JSON-ready report of one `coppelius node` (docs/NODE.md); `telemetry`: a
    coppelius.telemetry.Telemetry that sampled the GPUs, or None."""
    gpus = []
    for c, v in zip(children, verdicts):
        t = c.target
        gpus.append({"index": t.index, "name": t.name, "uuid": t.uuid, "pci_bus_id": t.pci_bus_id,
                     "verdict": v["verdict"], "reason": v["reason"],
                     "first_difference": v["first_difference"], "reference": v["reference"],
                     "kernel": v.get("kernel"), "soak": v.get("soak"),
                     "process": {"status": c.status, "returncode": c.returncode,
                                 "hung": c.hung, "wall_s": round(c.wall_s, 3),
                                 "ended_unix_s": c.ended_unix_s},
                     "host_gap_median_us": host_gap_median_us(c.result),
                     "result": str(c.result), "work_directory": str(c.directory),
                     "telemetry": (telemetry.samples.get(t.uuid) or None) if telemetry else None,
                     "telemetry_file": _telemetry_file(c.result)})
    counts = {k: sum(g["verdict"] == k for g in gpus) for k in ("PASS", "FAIL", "TIE", "ERROR")}
    return {"schema": SCHEMA, "host": socket.gethostname(), "profile": inv.profile,
            "backend": inv.backend, "steps": inv.steps, "work": str(inv.work),
            "digests": inv.digesting, "soak": inv.soak,
            "timeout_s": inv.timeout_s, "gpus": gpus, "counts": counts,
            "telemetry": telemetry.report() if telemetry else {"available": False,
                                                                "reason": "not sampled"},
            "exit": exit_code(gpus)}


def host_gap_median_us(result) -> float | None:
    """The median host gap of a result file's updates (what `coppelius inspect` shows as p50:
    the previous issue's fence → the update's issue), or None where the file is unreadable or
    timed no update."""
    try:
        rf = read(result)
    except ResultFileError:
        return None
    p50, _ = percentiles(host_gaps_us(rf)[1])
    return None if p50 is None else round(p50, 3)


def _telemetry_file(result) -> str | None:
    """The telemetry the GPU's own run recorded beside its result (start, publications, end),
    where it wrote one: the node's samples above are taken from outside the run."""
    path = telemetry_file.path_for(result)
    return str(path) if path.is_file() else None


def junit_xml(report: dict) -> bytes:
    """One test case per GPU; a failure carries the first difference or how the run ended."""
    suite = ET.Element("testsuite", name=f"coppelius node {report['host']}",
                       tests=str(len(report["gpus"])),
                       failures=str(report["counts"]["FAIL"] + report["counts"]["TIE"]),
                       errors=str(report["counts"]["ERROR"]))
    for g in report["gpus"]:
        where = f" {g['uuid']} ({g['pci_bus_id']})" if g["uuid"] else ""
        case = ET.SubElement(suite, "testcase", classname=f"coppelius.node.{report['host']}",
                             name=f"{'GPU' if g['uuid'] else 'slot'} {g['index']}{where}",
                             time=f"{g['process']['wall_s']:.3f}")
        if g["verdict"] == PASS:
            continue
        kind = "error" if g["verdict"] == ERROR else "failure"
        text = g["reason"]
        if g["first_difference"]:
            fd = g["first_difference"]
            text = f"first difference: section {fd['section']}, {fd['where']}"
        if (g["kernel"] or {}).get("launch") is not None:
            k = g["kernel"]
            text += f"; first divergent launch #{k['launch']} {k['label']} ({k['kernel']})"
        el = ET.SubElement(case, kind, message=f"{g['verdict']}: {text}", type=g["verdict"])
        el.text = (f"{g['verdict']}: {g['reason']}\n{text}\nprocess: {g['process']['status']}\n"
                   f"result: {g['result']}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
