"""Telemetry's refusals to fail: no GPU, no nvidia-ml-py, no library; and the table's line."""
from __future__ import annotations

import sys

from coppelius.node.telemetry import Telemetry, summary_line


def test_no_gpu_and_no_package_are_unavailable_never_a_failure(monkeypatch):
    t = Telemetry(["", ""])
    assert not t.available and "no GPU" in t.reason
    monkeypatch.setitem(sys.modules, "pynvml", None)          # nvidia-ml-py not installed
    t = Telemetry(["GPU-636f7070-656c-6975-732d-677000000000"])
    assert not t.available and "nvidia-ml-py is not installed" in t.reason
    t.sample("start")
    t.tick()
    t.close()
    assert t.samples == {"GPU-636f7070-656c-6975-732d-677000000000": []}
    assert t.report()["available"] is False


def test_summary_line_shows_first_to_last_and_the_worst_counters():
    a = dict(temperature_c=40, power_w=300.0, sm_clock_mhz=1980, memory_clock_mhz=3201,
             throttle_reasons=0, ecc_volatile_corrected=0, ecc_volatile_uncorrected=0,
             retired_pages_pending=0, row_remap_pending=0)
    b = dict(a, temperature_c=44, throttle_reasons=0x8, ecc_volatile_uncorrected=2)
    line = summary_line([a, b])
    assert line.startswith("40→44 °C, 300 W, 1980 MHz SM, 3201 MHz mem, throttle 0x8")
    assert "ECC volatile 0/2" in line and summary_line([]) == "no samples"
