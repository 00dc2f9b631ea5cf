"""The side-by-side benchmark on the CPU, against the committed golden result (no Coppelius run):
same initial weights, same contexts, same AdamW, bf16 operands; the first losses agree.

The device check itself (tools/gpu_check.sh, which runs this benchmark in its torch phases) is tested
by tests/tools/test_gpu_check.py.
"""
import json
import subprocess
import sys

import pytest
from tests.support.paths import ROOT

GOLDEN = ROOT / "tests" / "golden" / "tiny-result-c0.bin"


@pytest.mark.skipif(not GOLDEN.exists(), reason="no golden: run python -m tools.make_golden")
def test_bench_torch_beside_a_result_file(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "tools.bench_torch", "--result", str(GOLDEN),
                        "--steps", "3", "--warmup", "1", "--device", "cpu", "--variants", "eager",
                        "--agree-steps", "3", "--directory", str(tmp_path / "stream"),
                        "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    j = json.loads(out.read_text())
    assert [row["variant"] for row in j["rows"]] == ["coppelius", "eager"]
    cop, eager = j["rows"]
    assert cop["what"] == "coppelius (interpret)" and cop["ms_p50"] > 0
    assert eager["ms_p50"] > 0 and eager["ratio"] == pytest.approx(eager["ms_p50"] / cop["ms_p50"])
    assert eager["device_ms_p50"] is None                # no device events on the CPU
    # bf16 operands on both sides: the same model to well under a thousandth of a nat
    assert len(eager["losses"]) == len(j["coppelius"]["losses"]) == 3
    assert j["agreement"]["eager"] < 1e-3, j["agreement"]


def test_bench_torch_refuses_a_continued_result(tmp_path):
    """The torch side starts from the fresh initialization: a result with c0 > 0 is refused."""
    from coppelius.results.reader import read
    from coppelius.staging import records as R
    if not GOLDEN.exists():
        pytest.skip("no golden: run python -m tools.make_golden")
    data = bytearray(GOLDEN.read_bytes())
    c0 = read(GOLDEN).offsets["status"][0] + R.STATUS_BLOCK.offset("c0")
    width = R.STATUS_BLOCK.dtype.fields["c0"][0].itemsize
    data[c0:c0 + width] = (5).to_bytes(width, "little")
    bad = tmp_path / "continued.bin"
    bad.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-m", "tools.bench_torch", "--result", str(bad),
                        "--device", "cpu", "--variants", "eager"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode != 0 and "continued from update" in r.stderr + r.stdout
