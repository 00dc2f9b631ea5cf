"""`coppelius inspect` — summary, --json fields, --plot, decoding, production-size speed."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

from coppelius import cli
from coppelius.cli import inspect as I
from coppelius.forensics import summary as SU
from coppelius.results import reader as RF
from coppelius.plan import profiles as P
from coppelius.staging import records as R

from tests.support.result_synth import synthesize
from tests.support.paths import ROOT

INSPECT_BUDGET_S = 2.0          # a production-size file is inspected in under 2 s


def _write(tmp_path, name="tiny", **kw):
    syn = synthesize(P.get(name), **kw)
    path = tmp_path / f"{name}-{kw.get('outcome', 0)}.res"
    syn.write(path, overwrite=True)
    return syn, path


def _json(capsys, *argv):
    assert cli.main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("outcome", sorted(R.OUTCOMES))
def test_json_fields(tmp_path, capsys, outcome):
    syn, path = _write(tmp_path, outcome=outcome, seed=outcome)
    info = _json(capsys, str(path))
    for key in ("profile", "size", "expected_size", "outcome", "steps_completed", "losses",
                "status", "error_notifier", "semaphores", "timestamps"):
        assert key in info, key
    assert info["profile"] == "tiny" and info["outcome"] == R.OUTCOMES[outcome]
    assert info["size"] == info["expected_size"] == path.stat().st_size
    want = syn.windows.astype(np.float64).mean(axis=1)
    got = np.array(info["losses"], np.float64)
    assert got.shape == want.shape and info["steps_completed"] == want.size
    worst = int(np.argmax(np.abs(got - want))) if want.size else 0
    assert np.allclose(got, want, rtol=0, atol=1e-12), f"step {worst}: {got[worst]} vs {want[worst]}"
    ts = np.frombuffer(syn.timestamps, R.TIMESTAMP_ENTRY.dtype)
    for field in R.TIMESTAMP_ENTRY.fields:
        assert info["timestamps"][field] == ts[field].tolist(), field
    st = R.STATUS_BLOCK.unpack(syn.status)
    assert info["status"]["steps_completed"] == st["steps_completed"]
    assert info["status"]["gp_put"] == st["gp_put"] == len(ts)
    assert info["status"]["device_name"] == "NVIDIA H200"
    assert [p["token"] for p in info["status"]["predictions"]] == st["predictions"][:, 0].tolist()
    assert [s["submission"] for s in info["semaphores"]] == ["forward", "update", "final"]
    if outcome == R.OUTCOME_COMPLETED:
        assert info["error_notifier"]["status"] == 0 and info["error_notifier"]["info_name"] is None
    else:
        assert info["error_notifier"]["status"] == (R.NOTIFIER_STATUS_NONE
                                                    if outcome == R.OUTCOME_INTERRUPTED
                                                    else R.NOTIFIER_STATUS_ERROR)
        assert info["error_notifier"]["reason"]
    if outcome == R.OUTCOME_DEVICE_ERROR:
        assert info["error_notifier"]["info_name"] in ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUresult 700")
    dev = (ts["device_final_ns"].astype(np.int64) - ts["device_prelaunch_ns"].astype(np.int64))[
        (ts["submission"] == 1) & (ts["flags"] & 1 == 1)]
    assert info["timing"]["device_step_ms_p50"] == pytest.approx(np.median(dev) / 1e6)
    assert info["loss_summary"]["first"] == pytest.approx(want[0])
    assert info["loss_summary"]["min"] == pytest.approx(want.min())


def test_text_summary(tmp_path, capsys):
    _, path = _write(tmp_path, outcome=R.OUTCOME_HOST_ERROR, seed=1)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for needle in ("profile tiny", "host error", "(matches)", "host I/O", "No space left",
                   "device time per update step", "semaphores (gpGet 5, gpPut 5)", "curve"):
        assert needle in out, needle


def test_non_finite_losses_are_null(tmp_path, capsys):
    syn = synthesize(P.get("tiny"))
    syn.windows[2, 1023] = np.nan
    syn.windows[5, 0] = np.inf
    syn.write(tmp_path / "nan.res")
    info = _json(capsys, str(tmp_path / "nan.res"))
    assert info["losses"][2] is None and info["losses"][5] is None
    assert info["loss_summary"]["non_finite_steps"] == 2
    assert None not in info["losses"][:2]


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    _, path = _write(tmp_path, outcome=R.OUTCOME_INTERRUPTED, steps=5)
    png = tmp_path / "p.png"
    assert cli.main(["inspect", str(path), "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    from coppelius.forensics.plot import plot
    rf = RF.read(path)
    from coppelius.levels import RunLevels
    plot(rf, tmp_path / "floor.png", levels=RunLevels.of_run(rf.profile, 0, rf.steps))
    plot(RF.read(_write(tmp_path, outcome=R.OUTCOME_HOST_ERROR, steps=0)[1]),
         tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 10_000


def test_plot_without_matplotlib(tmp_path, monkeypatch, capsys):
    _, path = _write(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["inspect", str(path), "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    # the hint: this Python's pip and matplotlib itself (tests/host/cli/test_hints_run.py)
    assert "needs matplotlib" in err and err.count("\n") == 1
    assert f"{sys.executable} -m pip install 'matplotlib" in err, err
    assert not (tmp_path / "p.png").exists()


def test_predictions_decoded_with_shipped_tokenizer(tmp_path, monkeypatch):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    prof = P.get("coppelius")
    vocab = {f"w{i}": i for i in range(prof.vocab)}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="w0"))
    tj = tmp_path / "tokenizer.json"
    tok.save(str(tj))
    monkeypatch.setattr(SU, "TOKENIZER", tj)
    assert SU.decode_tokens(prof, [5, 12287]) == ["w5", "w12287"]
    assert SU.decode_tokens(P.get("tiny"), [5]) == [None]          # only the coppelius profile
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert SU.decode_tokens(prof, [5]) == [None]                    # quietly without the package
    monkeypatch.setattr(SU, "TOKENIZER", tmp_path / "absent.json")
    assert SU.decode_tokens(prof, [5]) == [None]


def test_sparkline():
    assert I.sparkline(np.linspace(9, 1, 500), width=8) == "█▇▆▅▄▃▂▁"
    assert I.sparkline(np.full(7, 3.0)) == "▁" * 7
    assert I.sparkline(np.array([np.nan, 1.0, 2.0])) == "▁█"
    assert I.sparkline(np.array([])) == ""


@pytest.fixture(scope="module")
def production_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prod") / "prod.res"
    synthesize(P.get("coppelius"), seed=7).write(path)
    return path


def test_production_size_inspected_under_2s(production_file):
    assert production_file.stat().st_size == 41_813_600
    for extra in ([], ["--json"]):
        # CPU time of the child (user + sys) is the work itself; wall time also counts the
        # other jobs sharing this 2-core machine, so it is printed, not asserted
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "coppelius.cli", "inspect", str(production_file),
                              *extra], cwd=ROOT, capture_output=True, text=True, timeout=60)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert out.returncode == 0, out.stderr
        print(f"inspect {' '.join(extra)}: {cpu:.2f} s CPU, {wall:.2f} s wall")
        assert cpu < INSPECT_BUDGET_S, f"inspect {extra} took {cpu:.2f} s of CPU"
    info = json.loads(out.stdout)
    assert info["steps_completed"] == 10_000 and len(info["losses"]) == 10_000
    assert len(info["timestamps"]["sequence"]) == 10_002
