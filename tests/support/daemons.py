"""What the tests that start real daemons share (tests/support/slurm.py, prometheus.py): free
loopback ports, stopping every process they started, and the tails of their logs for a failure's
message."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

STOP_TIMEOUT_S = 10         # SIGTERM, then SIGKILL after this long
LOOPBACK = "127.0.0.1"      # every daemon a test starts listens here only


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on the loopback address now (bound, read, released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop(procs: list[subprocess.Popen]) -> None:
    """Every process (each a session leader: its group), SIGTERM, then SIGKILL; reaped."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def log_tails(paths, tail: int) -> str:
    """The last `tail` lines of each log, under its name."""
    out = []
    for p in sorted(Path(x) for x in paths):
        lines = p.read_text(errors="replace").splitlines()[-tail:]
        out.append(f"--- {p.name}\n" + "\n".join(lines))
    return "\n".join(out)
