"""A real Slurm on this machine for a test: the distribution's slurmctld and one slurmd per node,
several nodes on one host, each with one fake GPU (a `gpu` generic resource on /dev/null, so
`--gres=gpu:1` works and Slurm sets CUDA_VISIBLE_DEVICES).

Everything lives in one temporary directory (configuration, state, spool, logs, pid files); the
daemons run in the foreground (`-D`) as this process's children, so they are stopped by PID,
whatever the outcome, and none outlives the `Cluster` context.  Authentication and credentials
are `none`: the daemons listen on the loopback address only and trust every local caller, which
is what a throwaway test cluster needs and nothing else should use.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support import daemons

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "sacct")
UP_TIMEOUT_S = 30           # the daemons are up and every node idle in about a second here
POLL_S = 0.1
LOOPBACK = daemons.LOOPBACK


class SlurmUnavailable(Exception):
    """Slurm cannot be run here; the message says why (a test skips with it)."""


def why_unavailable() -> str | None:
    """None when the daemons and clients are installed and we may run them, else the reason."""
    missing = [n for n in (*DAEMONS, *CLIENTS) if shutil.which(n) is None
               and not Path("/usr/sbin", n).exists()]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): .ci/run installs the "
                "distribution's slurmctld, slurmd and slurm-client when it runs as root")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as their user"
    return None


def _executable(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
    """`with Cluster(tmp, nodes=3) as c:` a controller and `nodes` slurmd, all idle on entry.

    `extra` lines are appended to slurm.conf (a Prolog=, a TaskProlog=, …).  `c.run(*argv)` runs
    a client command with this cluster's configuration; `c.pids` are the daemons' PIDs."""

    def __init__(self, where: Path, nodes: int = 3, extra: tuple[str, ...] = ()):
        self.dir = Path(where)
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.extra = extra
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _write_config(self) -> None:
        ctl, *node_ports = daemons.free_ports(1 + len(self.names))
        host = socket.gethostname()
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr={LOOPBACK} Port={p} CPUs=1 "
            f"RealMemory=1000 Gres=gpu:1 State=UNKNOWN" for n, p in zip(self.names, node_ports))
        self.conf.write_text(f"""\
ClusterName=coppelius-test
SlurmctldHost={host}({LOOPBACK})
SlurmctldPort={ctl}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
GresTypes=gpu
ReturnToService=2
StateSaveLocation={self.dir / 'state'}
SlurmdSpoolDir={self.dir / 'spool'}/%n
SlurmctldPidFile={self.dir / 'slurmctld.pid'}
SlurmdPidFile={self.dir / 'slurmd-%n.pid'}
SlurmctldLogFile={self.dir / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.dir / 'log' / 'slurmd-%n.log'}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=5
{chr(10).join(self.extra)}
{nodes}
PartitionName=test Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP
""")
        (self.dir / "gres.conf").write_text(
            "".join(f"NodeName={n} Name=gpu File=/dev/null\n" for n in self.names))
        for n in self.names:
            (self.dir / "spool" / n).mkdir(exist_ok=True)

    def _start(self, *argv: str, log: str) -> None:
        out = open(self.dir / "log" / log, "ab")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True))
        out.close()

    def __enter__(self) -> "Cluster":
        self._write_config()
        try:
            self._start(_executable("slurmctld"), "-D", "-i", "-f", str(self.conf),
                        log="slurmctld.out")
            for n in self.names:
                self._start(_executable("slurmd"), "-D", "-N", n, "-f", str(self.conf),
                            log=f"slurmd-{n}.out")
            self.wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, *argv: str, check: bool = True, timeout: float = 30,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """A client command with this cluster's configuration (`env`: more variables, for what
        sbatch exports to the job)."""
        r = subprocess.run([_executable(argv[0]), *argv[1:]], env={**self.env, **(env or {})},
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}\n"
                               f"{self.logs()}")
        return r

    def states(self) -> dict[str, str]:
        """node → its state as sinfo prints it ('idle', 'alloc', 'drain', 'down*', …)."""
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)

    def wait_idle(self) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while starting\n{self.logs()}")
            states = self.states()
            if sorted(states) == self.names and set(states.values()) == {"idle"}:
                return
            time.sleep(POLL_S)
        raise RuntimeError(f"nodes not idle after {UP_TIMEOUT_S} s: {self.states()}\n{self.logs()}")

    def wait_job(self, job: str, timeout: float) -> None:
        """Until no task of `job` is pending or running (squeue forgets finished jobs), polling
        every POLL_S: never sleeps longer than needed (sbatch --wait polls at 2, 8, 32 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.run("squeue", "-h", "-j", job, "-o", "%T", check=False)
            if r.returncode == 0 and not r.stdout.strip():
                return
            if r.returncode != 0 and "Invalid job id" in r.stderr:
                return
            time.sleep(POLL_S)
        raise TimeoutError(f"job {job} still queued after {timeout} s: "
                           f"{self.run('squeue', check=False).stdout}\n{self.logs()}")

    def logs(self, tail: int = 40) -> str:
        return daemons.log_tails((self.dir / "log").glob("*"), tail)

    def stop(self) -> None:
        """Every daemon this cluster started, by PID: SIGTERM, then SIGKILL; reaped."""
        daemons.stop(self.procs)


def alive(pid: int) -> bool:
    """Whether a process with this PID exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
