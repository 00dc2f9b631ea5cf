"""`coppelius inspect` and the telemetry file beside a result: a row per sample and the summary
line, the reason where telemetry was unavailable, "no telemetry recorded" where there is none,
and for a damaged file or another run's one warning naming the file and the field, never a
failure (exit 0 as without it).  The file as a run writes it:
tests/host/run/test_run_telemetry.py."""
from __future__ import annotations

import json

from coppelius import cli
from coppelius.plan import profiles
from coppelius.results import telemetry_file as TF

from tests.host.results.test_telemetry_file import good_doc
from tests.support.result_synth import synthesize


def result(tmp_path, telemetry: dict | str | None = None):
    """A synthesized tiny result (status block version 1: no GPU named) and its telemetry file."""
    path = tmp_path / "r.bin"
    synthesize(profiles.get("tiny")).write(path, overwrite=True)
    if telemetry is not None:
        text = telemetry if isinstance(telemetry, str) else json.dumps(telemetry)
        TF.path_for(path).write_text(text)
    return path


def inspect(capsys, path, *extra) -> tuple[int, str]:
    rc = cli.main(["inspect", str(path), *extra])
    return rc, capsys.readouterr().out


def test_a_row_per_sample_and_the_summary(tmp_path, capsys):
    path = result(tmp_path, good_doc(uuid=""))
    rc, out = inspect(capsys, path)
    assert rc == 0
    assert "telemetry of GPU 1 — (0000:9a:00.0) on node-017: 3 samples" in out
    rows = [line.split() for line in out.splitlines()
            if line.split()[:1] in (["start"], ["publication"], ["end"])]
    assert rows == [["start", "0", "0.0", "40", "300.5", "1980", "3201", "0x0", "0", "0", "0", "0",
                     "—"],
                    ["publication", "4", "1.5", "40", "300.5", "1980", "3201", "0x0", "0", "0", "0",
                     "0", "—"],
                    ["end", "4", "1.8", "44", "300.5", "1980", "3201", "0x8", "0", "0", "0", "0",
                     "—"]]
    assert ("telemetry: 40→44 °C, 300 W, 1980 MHz SM, 3201 MHz mem, throttle 0x8, ECC volatile "
            "0/0 (corr./uncorr.), retired pages pending no, row remap pending no") in out
    rc, out = inspect(capsys, path, "--json")
    tel = json.loads(out)["telemetry"]
    assert rc == 0 and tel["error"] is None and tel["file"] == str(TF.path_for(path))
    assert [s["update_count"] for s in tel["samples"]] == [0, 4, 4]
    assert tel["samples"][2]["readings"]["throttle_reasons"] == 8 and tel["summary"]


def test_unavailable_and_none(tmp_path, capsys):
    doc = dict(good_doc(uuid=""), available=False, samples=[],
               reason="telemetry unavailable: NVML: NVML Shared Library Not Found")
    path = result(tmp_path, doc)
    rc, out = inspect(capsys, path)
    assert rc == 0 and "telemetry unavailable: NVML: NVML Shared Library Not Found" in out
    TF.path_for(path).unlink()
    rc, out = inspect(capsys, path)
    assert rc == 0 and "no telemetry recorded (no r.bin.telemetry.json beside the file" in out
    rc, out = inspect(capsys, path, "--json")
    assert rc == 0 and json.loads(out)["telemetry"] is None


def test_a_damaged_telemetry_file_is_a_warning_naming_the_field(tmp_path, capsys):
    doc = good_doc(uuid="")
    doc["samples"][1]["readings"]["power_w"] = "hot"
    path = result(tmp_path, doc)
    rc, out = inspect(capsys, path)
    warning = (f"warning: telemetry file {TF.path_for(path)}: samples[1].readings: field "
               "'power_w' is \"hot\", not a number or null")
    assert rc == 0 and warning in out, out[-2000:]
    assert out.count("telemetry file") == 1 and "telemetry of GPU" not in out
    rc, out = inspect(capsys, path, "--json")
    info = json.loads(out)
    assert rc == 0 and "samples[1].readings: field 'power_w'" in info["telemetry"]["error"]
    assert info["telemetry"]["error"] in info["warnings"]
    TF.path_for(path).write_text('{"format": "coppelius-telemetry", "version": 1, "resu')
    rc, out = inspect(capsys, path)
    assert rc == 0 and "not a complete JSON document" in out


def test_another_runs_telemetry_is_not_shown(tmp_path, capsys):
    path = result(tmp_path, good_doc())                    # names a GPU; the result names none
    rc, out = inspect(capsys, path)
    assert rc == 0 and "belongs to another run (not shown)" in out
    assert "telemetry of GPU" not in out
