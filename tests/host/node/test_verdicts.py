"""`coppelius node`'s verdicts and reports on synthetic result files: the majority, a tie, --expect
(a file or a directory), a run that did not complete, a refused run, an unreadable result; the JSON
schema's fields, the exit status and the JUnit XML."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from coppelius.node import SCHEMA, Invocation, exit_code, judge, junit_xml, node_report
from coppelius.node.children import Child
from coppelius.node.targets import NodeRefused, Target
from coppelius.plan import profiles as P
from tests.support.result_synth import synthesize


def _children(tmp_path: Path, flipped: set[int], n: int = 3, rc: dict | None = None) -> list:
    syn = synthesize(P.get("tiny"), steps=2)
    out = []
    for i in range(n):
        d = tmp_path / f"gpu{i}"
        d.mkdir(parents=True)
        s = syn
        if i in flipped:
            w = syn.windows.copy()
            w[1, 7] = np.float32(-3.0)
            s = replace(syn, windows=w)
        s.write(d / "r.bin")
        t = Target(i, "NVIDIA H200", f"GPU-{i:08x}-0000-0000-0000-000000000000",
                   f"0000:{0x18 + i:02x}:00.0")
        code = (rc or {}).get(i, 0)
        out.append(Child(t, d, d / "r.bin", [], returncode=code, wall_s=1.0,
                         stderr="coppelius: no CUDA device 7 (3 found) (hint: …)\n" if code == 2
                         else ""))
    return out


def test_the_majority_passes_and_the_odd_gpu_fails_with_its_first_difference(tmp_path):
    kids = _children(tmp_path, {1})
    v = judge(kids)
    assert [x["verdict"] for x in v] == ["PASS", "FAIL", "PASS"]
    fd = v[1]["first_difference"]
    assert fd["section"] == "steps" and fd["step"] == 1 and fd["row"] == 7
    rep = node_report(Invocation(profile="tiny", work=tmp_path), kids, v)
    assert rep["schema"] == SCHEMA and rep["exit"] == 1 and rep["counts"]["FAIL"] == 1
    g = rep["gpus"][1]
    assert g["uuid"].startswith("GPU-00000001") and g["pci_bus_id"] == "0000:19:00.0"
    xml = ET.fromstring(junit_xml(rep))
    cases = xml.findall(".//testcase")
    assert len(cases) == 3 and cases[1].find("failure") is not None
    assert "GPU-00000001" in cases[1].get("name") and "0000:19:00.0" in cases[1].get("name")
    assert "step 1, row 7" in cases[1].find("failure").get("message")
    assert cases[0].find("failure") is None


def test_a_tie_is_reported_never_guessed(tmp_path):
    v = judge(_children(tmp_path, {1}, n=2))
    assert [x["verdict"] for x in v] == ["TIE", "TIE"]
    assert "no majority" in v[0]["reason"] and exit_code(v) == 1


def test_expect_a_file_or_a_directory(tmp_path):
    kids = _children(tmp_path / "n", {0}, n=2)
    good = tmp_path / "good"
    good.mkdir()
    synthesize(P.get("tiny"), steps=2).write(good / "known.bin")
    for expect in (good / "known.bin", good):
        v = judge(kids, expect)
        assert [x["verdict"] for x in v] == ["FAIL", "PASS"]
        assert v[1]["reference"].endswith("known.bin")
    with pytest.raises(NodeRefused, match="no known-good result"):
        judge(kids, tmp_path / "nothing")


def test_dead_refused_and_unreadable_runs(tmp_path):
    kids = _children(tmp_path, set(), n=4, rc={1: -9, 2: 2})
    kids[3].result.write_bytes(b"not a result")
    v = judge(kids)
    assert [x["verdict"] for x in v] == ["PASS", "FAIL", "ERROR", "FAIL"]
    assert "killed by SIGKILL" in v[1]["reason"]
    assert "could not run: coppelius: no CUDA device 7" in v[2]["reason"]
    assert "unreadable" in v[3]["reason"]
    assert exit_code(v) == 2
    kids[0].hung, kids[0].returncode = True, -9
    assert "hung" in judge(kids[:1])[0]["reason"]
