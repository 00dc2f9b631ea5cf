"""Regenerate (or check) the committed golden result: the tiny profile's embedded default run on the
interpret backend, `tests/golden/tiny-result-c0.bin`, and the per-launch digests of its first
update, `tests/golden/tiny-digests-c0-s0.json`.

  .venv/bin/python -m tools.make_golden            # rewrite the golden (~1.5 min)
  .venv/bin/python -m tools.make_golden --check    # run, compare, change nothing

It runs exactly what `coppelius run --profile tiny --backend interpret` runs with no arguments (a
fresh checkpoint, the embedded stream, every step of the profile), in a temporary directory, and
then `coppelius diff`s the new file against the committed one (time and environment fields apart).
The golden pins the interpret backend's bits (the kernels, the launch lists, the Triton pin, the
numerics); the device check compares a cuda tiny run with it (`diff --across-backends`).  The same
run writes the digests of step 0 (`--digests`), checked with `coppelius bisect` (bitwise); the
device check bisects the cuda digests of that step against them (tolerances across backends), so
a cuda tiny run that differs names its kernel.  Whenever the stream, the kernels or the launch lists
change on purpose, rerun this and commit both files.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "tests" / "golden"
GOLDEN = GOLDEN_DIR / "tiny-result-c0.bin"     # the embedded default's name: <profile>-result-c<c0>
GOLDEN_DIGESTS = GOLDEN_DIR / "tiny-digests-c0-s0.json"    # step 0's update, launch by launch
PROFILE = "tiny"


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, **kw)


def run_default(directory: Path) -> tuple[Path, Path]:
    """The embedded default run of the tiny profile on the interpret backend, step 0 digested;
    its result file and digests file."""
    ckpt, result = directory / f"{PROFILE}.ckpt", directory / GOLDEN.name
    digests = directory / GOLDEN_DIGESTS.name
    ckpt.write_bytes(b"")
    r = cli("run", "--profile", PROFILE, "--backend", "interpret", "--quiet",
            "--directory", directory / "run", "--checkpoint", ckpt, "--result", result,
            "--digests", digests, "--digest-step", 0)
    if r.returncode != 0:
        raise SystemExit(f"the interpret run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return result, digests


def check_one(golden: Path, fresh: Path, command: str) -> bool:
    """`coppelius diff|bisect GOLDEN FRESH`: whether the committed file reproduced (printed)."""
    d = cli(command, golden, fresh) if golden.exists() else None
    same = d is not None and d.returncode == 0
    print(f"{golden.relative_to(ROOT)}: "
          + ("reproduced bit for bit" if same else
             "missing" if d is None else "differs from a fresh run"))
    if d is not None and not same:
        print(d.stdout[-3000:] + d.stderr[-1000:])
    return same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare a fresh run with the committed golden; write nothing")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="coppelius-golden-") as tmp:
        fresh = run_default(Path(tmp))
        pairs = ((GOLDEN, fresh[0], "diff"), (GOLDEN_DIGESTS, fresh[1], "bisect"))
        same = [check_one(golden, new, command) for golden, new, command in pairs]
        if a.check:
            return 0 if all(same) else 1
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for (golden, new, _), kept in zip(pairs, same):
            if not kept:
                shutil.copyfile(new, golden)
                print(f"wrote {golden.relative_to(ROOT)} ({golden.stat().st_size:,} bytes): "
                      "commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
