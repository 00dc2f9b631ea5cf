"""coppelius.telemetry's refusals to fail (no GPU, no nvidia-ml-py) and its summary line; the
readings through the real nvidia-ml-py are tested against the C stub of libnvidia-ml.so.1 in a
subprocess (tests/host/node/test_node_stub.py, tests/host/run/test_run_telemetry.py)."""
from __future__ import annotations

import sys

from coppelius.telemetry import READINGS, Telemetry, summary_line

UUID = "GPU-636f7070-656c-6975-732d-677000000000"


def test_no_gpu_and_no_package_are_unavailable_never_a_failure(monkeypatch):
    t = Telemetry(["", ""])
    assert not t.available and "no GPU" in t.reason
    monkeypatch.setitem(sys.modules, "pynvml", None)          # nvidia-ml-py not installed
    t = Telemetry([UUID])
    assert not t.available and "nvidia-ml-py is not installed" in t.reason
    t.sample("start")
    t.tick()
    assert t.read() == {}
    t.close()
    assert t.samples == {UUID: []}
    assert t.report()["available"] is False


def _reading(**kw):
    return dict(dict.fromkeys(READINGS, 0), temperature_c=40, power_w=300.0, sm_clock_mhz=1980,
                memory_clock_mhz=3201, **kw)


def test_summary_line_shows_first_to_last_and_the_worst_counters():
    a = _reading()
    b = dict(a, temperature_c=44, throttle_reasons=0x8, ecc_volatile_uncorrected=2)
    line = summary_line([a, b])
    assert line.startswith("40→44 °C, 300 W, 1980 MHz SM, 3201 MHz mem, throttle 0x8")
    assert "ECC volatile 0/2" in line and summary_line([]) == "no samples"


def test_summary_line_with_a_reading_missing_at_one_end():
    """A GPU that stopped answering between the first sample and the last reads null there."""
    line = summary_line([_reading(), dict.fromkeys(READINGS)])
    assert line.startswith("40→— °C, 300→— W") and "throttle none" in line
