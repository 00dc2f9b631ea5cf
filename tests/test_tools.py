"""Issue 9 on the CPU: gpu_check.sh --dry-run lists its steps; the benchmark runs end to end on the
tiny profile with torch on the CPU beside the interpret backend (a dry run of its logic)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_prints_every_step(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--dry-run"],
                       capture_output=True, text=True, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    for step in ("doctor", "gpu tests", "tiny cuda a", "diff cuda×2", "diff cuda×interp",
                 "production", "inspect", "benchmark", "report.md"):
        assert step in r.stdout, step
    assert not list(tmp_path.iterdir())            # a dry run writes nothing


def test_bench_torch_dry_run(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_torch.py"), "--profile", "tiny",
                        "--steps", "2", "--warmup", "1", "--backend", "interpret", "--device", "cpu",
                        "--variants", "eager", "--agree-steps", "2", "--json", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    j = json.loads(out.read_text())
    names = [row["what"] for row in j["rows"]]
    assert names[0].startswith("coppelius") and any("torch eager" in n for n in names)
    assert all(row["ms_p50"] > 0 for row in j["rows"])
    # same initial weights, same contexts, same learner: the first losses agree (torch on the CPU
    # is fp32 without the bf16 rounding, hence the loose bound)
    assert j["agreement"]["eager"] < 5e-3, j["agreement"]
    assert len(j["coppelius_losses"]) == 2
