"""The telemetry file beside a result file (docs/FORMATS.md §12): the recorder writes it whole each
time it grows and never fails (no GPU: no file; no nvidia-ml-py: the reason, once; an unwritable
place: one warning), and the reader refuses a damaged file naming the file and the field.  The
readings through the real nvidia-ml-py and the C stub of libnvidia-ml.so.1 are
tests/host/run/test_run_telemetry.py's."""
from __future__ import annotations

import json
import sys

import pytest

from coppelius.driver.device import GpuIdentity
from coppelius.results import telemetry_file as TF
from coppelius.telemetry import READINGS

GPU = GpuIdentity(1, "NVIDIA H200", bytes(range(16)), "0000:9a:00.0")


def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # nvidia-ml-py not installed


def good_doc(uuid: str = GPU.uuid_text, c0: int = 0) -> dict:
    readings = dict(dict.fromkeys(READINGS, 0), temperature_c=40, power_w=300.5,
                    sm_clock_mhz=1980, memory_clock_mhz=3201, row_remap_failure=None)
    when = "2026-01-02T03:04:05.678+00:00"
    samples = [{"phase": p, "update_count": n, "t_s": t, "wall_time": when,
                "readings": dict(readings)} for p, n, t in (("start", c0, 0.0),
                                                             ("publication", c0 + 4, 1.5),
                                                             ("end", c0 + 4, 1.75))]
    samples[-1]["readings"].update(temperature_c=44, throttle_reasons=0x8)
    return {"format": TF.FORMAT, "version": TF.VERSION, "result": "r.bin", "host": "node-017",
            "c0": c0, "gpu": {"index": 1, "uuid": uuid, "pci_bus_id": "0000:9a:00.0",
                              "name": "NVIDIA H200"},
            "available": True, "reason": None, "samples": samples}


def test_the_name_is_the_result_files_plus_a_suffix(tmp_path):
    assert TF.path_for(tmp_path / "tiny-result-c0.bin") == \
        tmp_path / "tiny-result-c0.bin.telemetry.json"


def test_no_gpu_records_nothing(tmp_path):
    rec = TF.Recorder(tmp_path / "r.bin", None, 0, warn=pytest.fail)
    for phase in TF.PHASES:
        rec.sample(phase, 0)
    rec.close()
    assert not TF.path_for(tmp_path / "r.bin").exists()


def test_unavailable_telemetry_is_recorded_once_with_its_reason(tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    rec = TF.Recorder(tmp_path / "r.bin", GPU, 12, warn=pytest.fail)
    rec.sample("start", 12)
    path = TF.path_for(tmp_path / "r.bin")
    doc = TF.read(path)
    assert doc["available"] is False and doc["samples"] == []
    assert doc["reason"].startswith("telemetry unavailable: nvidia-ml-py is not installed")
    assert doc["gpu"] == {"index": 1, "uuid": GPU.uuid_text, "pci_bus_id": "0000:9a:00.0",
                          "name": "NVIDIA H200"}
    assert (doc["result"], doc["c0"]) == ("r.bin", 12) and doc["host"]
    path.unlink()
    rec.sample("publication", 16)                   # nothing new to say: not written again
    assert not path.exists()
    rec.close()


def test_discard_removes_what_this_run_wrote(tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    rec = TF.Recorder(tmp_path / "r.bin", GPU, 0, warn=pytest.fail)
    rec.sample("start", 0)
    assert TF.path_for(tmp_path / "r.bin").exists()
    rec.discard()
    assert not TF.path_for(tmp_path / "r.bin").exists()
    assert not list(tmp_path.iterdir())             # no temporary left either


def test_a_file_that_cannot_be_written_is_one_warning(tmp_path, monkeypatch):
    no_nvml(monkeypatch)
    warned = []
    rec = TF.Recorder(tmp_path / "gone" / "r.bin", GPU, 0, warn=warned.append)
    rec.sample("start", 0)
    rec.sample("end", 0)
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"warning: cannot write the telemetry file {tmp_path / 'gone'}")
    assert "the run goes on" in warned[0]


def test_a_good_file_reads_back(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good_doc()))
    assert TF.read(path) == good_doc()


def _mutate(doc: dict, where: str, value) -> dict:
    """`doc` with the field at a dotted path ("samples.1.readings.power_w") set to `value`, or
    removed where `value` is DELETE."""
    *parents, last = where.split(".")
    obj = doc
    for p in parents:
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    if value is DELETE:
        del obj[last]
    else:
        obj[last] = value
    return doc


DELETE = object()
DAMAGES = [  # (field path, new value, what the message must name)
    ("format", "coppelius-digests", "field 'format' is \"coppelius-digests\""),
    ("version", 2, "field 'version' is 2; this coppelius reads version 1"),
    ("c0", DELETE, "has no field 'c0'"),
    ("c0", "0", "field 'c0' is \"0\", not an update count"),
    ("available", 1, "field 'available' is 1, not true or false"),
    ("reason", 3, "field 'reason' is 3"),
    ("gpu", [], "gpu: is not a JSON object"),
    ("gpu.uuid", 7, "gpu: field 'uuid' is 7, not a string"),
    ("gpu.index", True, "gpu: field 'index' is true, not an ordinal"),
    ("samples", {}, "field 'samples' is {}, not a list"),
    ("samples.1.phase", "middle", "samples[1]: field 'phase' is \"middle\", not one of start"),
    ("samples.1.update_count", -1, "samples[1]: field 'update_count' is -1, below 0"),
    ("samples.2.t_s", None, "samples[2]: field 't_s' is null, not seconds"),
    ("samples.0.wall_time", DELETE, "samples[0]: has no field 'wall_time'"),
    ("samples.1.readings", None, "samples[1].readings: is not a JSON object"),
    ("samples.1.readings.power_w", "hot", "samples[1].readings: field 'power_w' is \"hot\""),
    ("samples.1.readings.throttle_reasons", 8.0,
     "samples[1].readings: field 'throttle_reasons' is 8.0, not a whole number or null"),
    ("samples.2.readings.row_remap_pending", DELETE,
     "samples[2].readings: has no field 'row_remap_pending'"),
]


@pytest.mark.parametrize("where,value,named", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_a_damaged_file_is_refused_naming_the_field(tmp_path, where, value, named):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_mutate(good_doc(), where, value)))
    with pytest.raises(TF.TelemetryFileError) as e:
        TF.read(path)
    assert e.value.message.startswith(f"telemetry file {path}: "), e.value.message
    assert named in e.value.message, e.value.message


@pytest.mark.parametrize("text,named", [
    ('{"format": "coppelius-telemetry", "vers', "not a complete JSON document"),
    ('{"format": "coppelius-telemetry", "version": NaN}', "holds NaN, not JSON"),
    ("[1, 2]", "the file is not a JSON object"),
    ("", "not a complete JSON document"),
])
def test_what_is_not_a_telemetry_file_is_refused(tmp_path, text, named):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(TF.TelemetryFileError, match=named):
        TF.read(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(TF.TelemetryFileError, match="not UTF-8 text"):
        TF.read(path)


def test_for_result_none_another_runs_and_a_good_one(tmp_path):
    result = tmp_path / "r.bin"
    ran_on = {"host_name": "node-017", "gpu_uuid": GPU.uuid_text, "pci_bus_id": "0000:9a:00.0"}
    assert TF.for_result(result, ran_on, 0) is None
    TF.path_for(result).write_text(json.dumps(good_doc()))
    shown = TF.for_result(result, ran_on, 0)
    assert shown["error"] is None and shown["file"] == str(TF.path_for(result))
    assert shown["summary"].startswith("40→44 °C, 300 W, 1980 MHz SM, 3201 MHz mem, throttle 0x8")
    assert [s["phase"] for s in shown["samples"]] == ["start", "publication", "end"]
    other = TF.for_result(result, dict(ran_on, gpu_uuid=""), 0)
    assert "belongs to another run" in other["error"] and "the result file no GPU" in other["error"]
    assert "belongs to another run" in TF.for_result(result, ran_on, 5)["error"]
