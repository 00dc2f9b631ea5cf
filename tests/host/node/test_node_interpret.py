"""`coppelius node` on the interpret backend (the numeric path, no GPU): tiny, one step, two CPU
slots at once; both reproduce each other bit for bit (PASS, exit 0), and each result file names
the host (status block version 2) and no GPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coppelius.results.reader import read
from tests.support.paths import ROOT


def test_node_on_the_interpreter(tmp_path):
    pytest.importorskip("triton", reason="the interpret backend needs Triton")
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", "node", "--profile", "tiny",
                        "--backend", "interpret", "--steps", "1", "--count", "2", "--work",
                        str(tmp_path / "n"), "--json", "--junit", str(tmp_path / "n.xml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert [(g["index"], g["verdict"], g["uuid"]) for g in rep["gpus"]] == [(0, "PASS", ""),
                                                                           (1, "PASS", "")]
    rf = read(rep["gpus"][1]["result"])
    assert rf.status_version == 2 and rf.steps == 1 and rf.outcome == "completed"
    assert rf.gpu_identity()["host_name"] and rf.gpu_identity()["gpu_uuid"] == ""
    assert (tmp_path / "n.xml").read_text().count("<testcase") == 2
