"""Checkpoint throughput at production size (692 MB): publish and load vs `dd` + `sha256sum`
over the same bytes, in the same run.  Not part of the test suite.

    .venv/bin/python -m tools.bench_checkpoint [--dir DIR] [--repeats 3] [--profile coppelius]

Publish is compared with `dd if=SRC of=DST bs=4M conv=fsync` followed by `sha256sum DST`
(a durable write of the payload plus one digest pass); load with `dd if=CKPT of=/dev/null bs=4M`
followed by `sha256sum CKPT`, and with the pipe `dd if=CKPT bs=4M | sha256sum`.  Ratio = baseline
seconds / ours (≥ 1 means we are faster).  Files stay in the page cache between steps (no root to
drop it), which is also the state a run's publish and a continuation's load meet.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from coppelius import checkpoints
from coppelius.checkpoints import format as CF
from coppelius.plan import profiles


CPU: dict[str, list[float]] = {}          # name → CPU seconds (user + sys) per repeat


def _cpu(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def timed_shell(name: str, command: str) -> float:
    t0, c0 = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
    subprocess.run(["bash", "-c", command], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    CPU.setdefault(name, []).append(
        _cpu(resource.RUSAGE_CHILDREN) - c0)
    return time.perf_counter() - t0


def timed_self(name: str, fn) -> float:
    t0, c0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
    fn()
    CPU.setdefault(name, []).append(_cpu(resource.RUSAGE_SELF) - c0)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="scratch directory (default: a new one under /tmp)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", default="coppelius")
    args = ap.parse_args()
    prof = profiles.get(args.profile)
    work = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir)
    try:
        n = prof.parameter_count
        rng = np.random.default_rng(0)
        P, M, V = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))   # (n,) each
        src, dst, ckpt = (os.path.join(work, x) for x in ("payload.bin", "dd.bin", "run.ckpt"))
        with open(src, "wb") as f:
            for plane in (P, M, V):
                f.write(plane.tobytes())
        mb = prof.payload_bytes / 1e6
        rows: dict[str, list[float]] = {k: [] for k in (
            "publish", "dd conv=fsync + sha256sum", "load", "dd + sha256sum (read)",
            "dd | sha256sum")}
        for _ in range(args.repeats):
            rows["dd conv=fsync + sha256sum"].append(
                timed_shell("dd conv=fsync", f"dd if={src} of={dst} bs=4M conv=fsync") +
                timed_shell("sha256sum (written file)", f"sha256sum {dst}"))
            os.unlink(dst)
            rows["publish"].append(timed_self("publish", lambda: checkpoints.publish(
                ckpt, prof, P, M, V, update_count=1000)))
            rows["dd + sha256sum (read)"].append(
                timed_shell("dd of=/dev/null", f"dd if={ckpt} of=/dev/null bs=4M")
                + timed_shell("sha256sum (checkpoint)", f"sha256sum {ckpt}"))
            rows["dd | sha256sum"].append(timed_shell("dd | sha256sum", f"dd if={ckpt} bs=4M | sha256sum"))
            rows["load"].append(timed_self("load", lambda: checkpoints.load_chunks(
                ckpt, prof, lambda offset, view: None)))
        load_planes = timed_self("load into numpy planes", lambda: checkpoints.load(ckpt, prof))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"profile {prof.name}: payload {prof.payload_bytes:,} bytes, file "
              f"{CF.HEADER_BYTES + prof.payload_bytes:,} bytes, {args.repeats} repeats (median)")
        for k, v in med.items():
            print(f"  {k:28s} {v:6.2f} s  {mb / v:7.0f} MB/s   runs "
                  + " ".join(f"{x:.2f}" for x in rows[k]))
        print(f"  {'load into numpy planes':28s} {load_planes:6.2f} s  {mb / load_planes:7.0f} MB/s")
        print(f"ratio publish: {med['dd conv=fsync + sha256sum'] / med['publish']:.2f}  "
              f"load: {med['dd + sha256sum (read)'] / med['load']:.2f} "
              f"(vs pipe {med['dd | sha256sum'] / med['load']:.2f})")
        print("CPU seconds (user+sys, median):")
        for k, v in CPU.items():
            print(f"  {k:28s} {statistics.median(v):6.2f} s")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
