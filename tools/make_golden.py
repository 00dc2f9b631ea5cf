"""Regenerate (or check) the committed golden result: the tiny profile's embedded default run on the
interpret backend, `tests/golden/tiny-result-c0.bin`.

  .venv/bin/python -m tools.make_golden            # rewrite the golden (~1.5 min)
  .venv/bin/python -m tools.make_golden --check    # run, compare, change nothing

It runs exactly what `coppelius run --profile tiny --backend interpret` runs with no arguments (a
fresh checkpoint, the embedded stream, every step of the profile), in a temporary directory, and
then `coppelius diff`s the new file against the committed one (time and environment fields apart).
The golden pins the interpret backend's bits (the kernels, the launch lists, the Triton pin, the
numerics); the device check compares a cuda tiny run with it (`diff --across-backends`).  Whenever
the stream, the kernels or the launch lists change on purpose, rerun this and commit the file.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.blas_pin import pin

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "tests" / "golden"
GOLDEN = GOLDEN_DIR / "tiny-result-c0.bin"     # the embedded default's name: <profile>-result-c<c0>
PROFILE = "tiny"


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "host.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, **kw)


def run_default(directory: Path) -> Path:
    """The embedded default run of the tiny profile on the interpret backend; its result file."""
    ckpt, result = directory / f"{PROFILE}.ckpt", directory / GOLDEN.name
    ckpt.write_bytes(b"")
    r = cli("run", "--profile", PROFILE, "--backend", "interpret", "--quiet",
            "--directory", directory / "run", "--checkpoint", ckpt, "--result", result)
    if r.returncode != 0:
        raise SystemExit(f"the interpret run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare a fresh run with the committed golden; write nothing")
    a = ap.parse_args(argv)
    pin()                   # the golden's sgemm family, for the run's subprocess
    with tempfile.TemporaryDirectory(prefix="coppelius-golden-") as tmp:
        fresh = run_default(Path(tmp))
        if a.check or GOLDEN.exists():
            d = cli("diff", GOLDEN, fresh) if GOLDEN.exists() else None
            same = d is not None and d.returncode == 0
            print(f"{GOLDEN.relative_to(ROOT)}: "
                  + ("reproduced bit for bit" if same else "differs from a fresh run"))
            if d is not None and not same:
                print(d.stdout[-3000:])
            if a.check:
                return 0 if same else 1
            if same:
                return 0
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fresh, GOLDEN)
        print(f"wrote {GOLDEN.relative_to(ROOT)} ({GOLDEN.stat().st_size:,} bytes): commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
