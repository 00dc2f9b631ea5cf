"""The cuda backend through the real cuda-bindings and a C stub of libcuda.so.1 (tests/support/stub_cuda/).

doctor for both profiles and a tiny run end to end with zero violations (the run twice, the second
continuing from the first's checkpoint: the payload round-trips byte for byte), and each rule the
stub enforces firing beside a control call that passes (tests/support/stub_cuda/scenarios.py).  The stub
computes no model math, so no numeric verdict is asserted.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support import stub_driver
from coppelius.backends.cuda import ptx
from coppelius.plan.launches import graph as launch_graph
from coppelius.plan import launches
from coppelius.plan import profiles
from coppelius.plan import reference
from tests.support.paths import ROOT, STUB_CUDA

SCENARIOS = STUB_CUDA / "scenarios.py"
TINY_STEPS = 8                  # the tiny profile's most steps per run
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def stub() -> Path:
    return stub_driver.built_or_skip()


def through_stub(stub: Path, log: Path, *args: str, **settings) -> subprocess.CompletedProcess:
    """`python ARGS` in a subprocess whose cuda-bindings load the stub, logging to `log`."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S,
                          env=stub_driver.env(log, stub, COPPELIUS_STUB_QUIET=1, **settings))


def assert_clean(log: Path, processes: int = 1) -> dict:
    """The stub served `processes` processes with no violation; their summed counters."""
    assert stub_driver.violations(log) == []
    assert stub_driver.loaded(log) == processes, "the subprocess did not load the stub driver"
    return stub_driver.stats(log)


def test_build_names_why_it_cannot(monkeypatch, tmp_path):
    monkeypatch.setattr(stub_driver, "compiler", lambda: None)
    reason = stub_driver.build(tmp_path)
    assert isinstance(reason, str) and "no C compiler" in reason
    assert not (tmp_path / stub_driver.LIBRARY).exists()


def test_env_puts_the_stub_first_on_the_library_path(tmp_path):
    env = stub_driver.env(tmp_path / "log", tmp_path, base={"LD_LIBRARY_PATH": "/usr/lib/x"})
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}:/usr/lib/x"
    assert env[stub_driver.LOG_ENV] == str(tmp_path / "log")


@pytest.mark.parametrize("profile, cc, target", [("tiny", "9.0", "sm_90a"),
                                                 ("coppelius", "9.0", "sm_90a"),
                                                 ("tiny", "8.6", "sm_80")])
def test_doctor_passes_through_the_real_bindings(stub, tmp_path, profile, cc, target):
    log = tmp_path / "stub.log"
    done = through_stub(stub, log, "-m", "coppelius.cli", "doctor", "--profile", profile, "--json",
                        COPPELIUS_STUB_CC=cc)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert checks["PTX target"]["value"] == target
    assert "Coppelius stub driver" in checks["device"]["value"]
    files = {e.file.name for e in ptx.Manifest.load(profile, target).entries.values()}
    assert {m["file"] for m in report["modules"]} == files
    functions = [f for m in report["modules"] for f in m["functions"]]
    # the JIT's verbose log came back through the bindings' bytearray buffers
    assert all(f["spill_stores"] == 0 and f["spill_loads"] == 0 for f in functions)
    counts = assert_clean(log)
    assert counts["released"] == 1                      # the smoke launch ran
    assert counts["captured"] > len(functions)          # three submissions' graphs
    assert (counts["programmatic"] > 0) == (target == "sm_90a")
    # the plan's priority lane at the greatest priority, node by node, in all three graphs
    first = launch_graph.PRIORITY_LANE
    assert counts["priority_nodes"] == sum(x.lane == first for s in launches.submissions(
        profiles.get(profile)) for x in s.launches) > 0
    assert counts["node_priority_graphs"] == 3 and checks["stream priorities"]["ok"]
    assert "range 0 (least) to -5 (greatest)" in checks["stream priorities"]["value"]


def test_doctor_on_a_device_without_stream_priorities(stub, tmp_path):
    """Range 0..0: every lane at the default, no node-priority flag, a note; doctor passes."""
    log = tmp_path / "stub.log"
    done = through_stub(stub, log, "-m", "coppelius.cli", "doctor", "--profile", "tiny", "--json",
                        COPPELIUS_STUB_PRIORITIES="0,0")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "stream priorities")
    assert line["ok"] and "no stream priorities (range 0..0)" in line["value"]
    counts = assert_clean(log)
    assert counts["priority_nodes"] == counts["node_priority_graphs"] == 0


def _run(stub, tmp_path, log, name: str, checkpoint: Path) -> dict:
    result = tmp_path / f"{name}.bin"
    done = through_stub(stub, log, "-m", "coppelius.cli", "run", "--profile", "tiny", "--backend",
                        "cuda", "--quiet", "--directory", str(tmp_path / "run"), "--checkpoint",
                        str(checkpoint), "--result", str(result), "--steps", str(TINY_STEPS),
                        "--fence-timeout", "30")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    shown = subprocess.run([sys.executable, "-m", "coppelius.cli", "inspect", "--json", str(result)],
                           cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert shown.returncode == 0, shown.stderr[-2000:]
    return json.loads(shown.stdout)


def _payload(checkpoint: Path) -> tuple[bytes, int]:
    """A checkpoint's payload bytes and update count."""
    shown = subprocess.run([sys.executable, "-m", "coppelius.cli", "checkpoint", "show", "--json",
                            str(checkpoint)], cwd=ROOT, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    header = json.loads(shown.stdout)
    return checkpoint.read_bytes()[header["header_bytes"]:], header["update_count"]


def test_a_tiny_run_completes_and_its_checkpoint_round_trips(stub, tmp_path):
    log, checkpoint = tmp_path / "stub.log", tmp_path / "c.ckpt"
    checkpoint.write_bytes(b"")
    first = _run(stub, tmp_path, log, "first", checkpoint)
    assert first["outcome"] == "completed" and first["steps_completed"] == TINY_STEPS
    issues = first["timestamps"]
    assert len(issues["flags"]) == first["issues"] == TINY_STEPS + 2
    assert all(f & 1 for f in issues["flags"])           # FLAG_FENCE_OBSERVED, every issue
    assert issues["sequence"] == list(range(1, TINY_STEPS + 3))
    assert all(b >= a > 0 for a, b in zip(issues["device_prelaunch_ns"],
                                          issues["device_final_ns"]))
    payload, count = _payload(checkpoint)
    init = reference.init_parameters(profiles.get("tiny")).view(np.uint8).tobytes()
    assert count == TINY_STEPS
    assert payload == init + bytes(len(payload) - len(init))   # P, then M = V = 0: as uploaded

    second = _run(stub, tmp_path, log, "second", checkpoint)     # continues from the first
    assert second["outcome"] == "completed" and second["status"]["c0"] == TINY_STEPS
    assert _payload(checkpoint) == (payload, 2 * TINY_STEPS)
    counts = assert_clean(log, processes=2)
    assert counts["staged"] == counts["released"] == 2 * (TINY_STEPS + 2)
    assert counts["copied_kernels"] > 0 and counts["graph_launches"] == 2 * (TINY_STEPS + 2)


OK = "CUDA_SUCCESS"
RULES = {   # scenario: ({step: CUresult name}, [a fragment of each violation line, in order])
    "block_size": ({"wrong": "CUDA_ERROR_INVALID_VALUE", "right": OK, "sync": OK},
                   ["differs from the entry's .reqntid (32,1,1)"]),
    "shared_opt_in": ({"without": "CUDA_ERROR_INVALID_VALUE", "beyond_device":
                       "CUDA_ERROR_INVALID_VALUE", "opt_in": OK, "with": OK, "sync": OK},
                      ["65536 bytes of dynamic shared memory", "beyond the device's opt-in"]),
    "pointer_past_allocation": ({"inside": OK, "inside_sync": OK, "past": OK,
                                 "past_sync": "CUDA_ERROR_ILLEGAL_ADDRESS"},
                                ["is not inside a live allocation"]),
    "freed_before_replay": ({"begin": OK, "captured": OK, "replay": OK, "replay_sync": OK,
                             "free": OK, "after_free": OK,
                             "after_free_sync": "CUDA_ERROR_ILLEGAL_ADDRESS"},
                            ["cuGraphLaunch(probe): parameter 0"]),
    "captured_bad_pointer": ({"begin": OK, "captured": OK, "end": OK, "sync": OK},
                             ["the graph faults when it runs"]),
    "host_pointer": ({"mapped": OK, "mapped_sync": OK, "host": OK,
                      "host_sync": "CUDA_ERROR_ILLEGAL_ADDRESS"}, ["a host address"]),
    "misaligned": ({"aligned": OK, "aligned_sync": OK, "misaligned": OK,
                    "misaligned_sync": "CUDA_ERROR_MISALIGNED_ADDRESS"},
                   ["aligned to its .align 16"]),
    "timing": ({"timing": OK, "untimed": "CUDA_ERROR_INVALID_HANDLE",
                "never_recorded": "CUDA_ERROR_INVALID_HANDLE"},
               ["CU_EVENT_DISABLE_TIMING", "never recorded"]),
    "sync_in_capture": ({"begin": OK, "captured": OK,
                         "sync": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                         "end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "after": OK},
                        ["a synchronous call on a capturing stream", "invalidated by an earlier"]),
    "unjoined_capture": ({"begin": OK, "main": OK, "fork": OK, "wait": OK, "side": OK,
                          "end": "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
                         ["the origin stream does not wait for"]),
    "joined_capture": ({k: OK for k in ("begin", "main", "fork", "wait", "side", "back", "join",
                                        "after_join", "end", "replay", "sync")}, []),
    "isolation": ({"begin": OK, "wait": "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
                   "end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
                  ["recorded outside the capture", "invalidated by an earlier"]),
    "programmatic_without_wait": ({"waits": OK, "no_wait": OK},
                                  ["probe_nowait): a programmatic launch of a kernel without"]),
    "jit_refusal": ({"target": "CUDA_ERROR_INVALID_PTX",
                     "version": "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
                    ["sm_100a cannot be compiled", "Unsupported .version 9.9"]),
    "no_context": ({"without": "CUDA_ERROR_INVALID_CONTEXT", "with": OK},
                   ["no current context on this thread"]),
    "stream_priority": ({k: OK for k in ("range", "inside", "outside", "begin", "captured",
                                         "instantiate")},
                        ["priority -6 outside the range 0 (least) to -5 (greatest)"]),
}


@pytest.mark.parametrize("scenario", sorted(RULES))
def test_each_rule_fires_beside_a_control_that_passes(stub, tmp_path, scenario):
    from cuda.bindings import driver as d
    log = tmp_path / "stub.log"
    done = through_stub(stub, log, str(SCENARIOS), scenario)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    codes, fragments = RULES[scenario]
    assert {k: d.CUresult(got[k]).name for k in codes} == codes
    found = stub_driver.violations(log)
    assert len(found) == len(fragments), found
    for line, fragment in zip(found, fragments):
        assert fragment in line
    if scenario == "jit_refusal":       # the JIT's error log, in the caller's buffer
        assert got["target_log"].startswith("ptxas fatal") and "9.9" in got["version_log"]
    if scenario == "stream_priority":   # clamped; the captured node took its stream's priority
        assert (got["least"], got["greatest"], got["default_priority"]) == (0, -5, 0)
        assert got["inside_priority"] == got["outside_priority"] == -5
        assert (got["nodes"], got["node_type"], got["node_priority"]) == (1, 0, -5)


def test_a_graph_replay_runs_the_release_kernel_for_real(stub, tmp_path):
    """plan/kernels/release.ptx captured, then replayed after the doorbell rang: the payload
    reaches the mapped semaphore record only at the replay, with a timestamp."""
    log = tmp_path / "stub.log"
    done = through_stub(stub, log, str(SCENARIOS), "graph_release")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["before_replay"] == 0 and got["payload"] == 0x5EED and got["timestamp"] > 0
    assert assert_clean(log)["released"] == 1
