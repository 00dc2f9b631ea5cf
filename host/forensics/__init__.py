"""Forensics over what runs leave: diffs, fleet classes, the bisect comparison, summaries, tolerances, the plot.

The Python API (host/forensics/api.py, docs/API.md) is re-exported here: `read_result`,
`read_checkpoint`, `verify_checkpoint`, `compare_results`, `classify_results`, `compare_digests`,
`summarize_run`, `verify_result`, `json_ready`, `dumps`.  The command line (host/cli/) renders what
these modules return; nothing here imports it.
"""
from coppelius.forensics.api import (Checkpoint, Result, classify_results, compare_digests,
                                     compare_results, dumps, json_ready, read_checkpoint,
                                     read_result, summarize_run, verify_checkpoint, verify_result)

__all__ = ["Result", "read_result", "Checkpoint", "read_checkpoint", "verify_checkpoint",
           "compare_results", "classify_results", "compare_digests", "summarize_run",
           "verify_result", "json_ready", "dumps"]
