"""A fresh virtual environment beside this one: its own interpreter and site-packages, with this
environment's third-party packages (numpy, rich, cffi, …) reachable through one path entry, and
nothing of the project: the editable install's finder lives in a .pth file of this environment's
site-packages, and a site directory reached through a .pth line has its own .pth files skipped."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

PIP_TIMEOUT_S = 120


def fresh_venv(where: Path) -> Path:
    """A new venv at `where` (no pip of its own); returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def pip_into(python: Path, *args: str) -> None:
    """This environment's pip acting on another interpreter (`pip --python`), offline."""
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python),
                        "--disable-pip-version-check", "-q", *args],
                       capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr


def run(python: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python ARGS` from `cwd` with no PYTHONPATH and no package index reachable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_NO_INDEX="1", PIP_INDEX_URL="http://127.0.0.1:9/")
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)
