"""`coppelius node`: the same invocation on every visible GPU at once, one process per GPU, and a
verdict per GPU (docs/NODE.md).

`targets` lists what runs (the visible GPUs for the cuda backend; `count` CPU slots for the
interpret one), `children` starts and watches one `coppelius run` per target, each with its own
fresh checkpoint and result under the work directory, `verdicts` compares every result with the
reference (a known-good file or directory, else the node's majority class), `report` gives the
versioned JSON and the JUnit XML, and `metrics` the Prometheus metrics (`gathered`: the same for
result files that runs left elsewhere, the fleet's job array and node check).  `run_node` ties
them together.
"""
from __future__ import annotations

from coppelius.node.children import Child, Invocation, run_children
from coppelius.node.kernels import add_digests
from coppelius.node.report import SCHEMA, exit_code, junit_xml, node_report
from coppelius.node.targets import Target, targets
from coppelius.telemetry import INTERVAL_S, Telemetry
from coppelius.node.verdicts import judge, references

__all__ = ["Child", "Invocation", "SCHEMA", "Target", "Telemetry", "exit_code", "judge",
           "junit_xml", "node_report", "run_children", "run_node", "targets"]


def run_node(inv: Invocation, expect=None, count: int = 1,
             telemetry_interval_s: float = INTERVAL_S) -> dict:
    """Every target's run, their verdicts and telemetry, the report (docs/NODE.md): a dict with
    "exit"."""
    found = targets(inv.backend, count)
    if expect is not None:
        references(expect)                  # a bad reference: refused before any run
    telemetry = Telemetry([t.uuid for t in found], telemetry_interval_s)
    try:
        telemetry.sample("start")
        children = run_children(inv, found, on_poll=telemetry.tick)
        telemetry.sample("end")
    finally:
        telemetry.close()
    verdicts = judge(children, expect)
    if inv.digesting:
        add_digests(children, verdicts, inv.soak > 1)
    return node_report(inv, children, verdicts, telemetry)
