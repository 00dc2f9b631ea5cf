"""The C stub of libnvidia-ml.so.1 (nvml.c): build it with the system C compiler, as the stub
driver is built (tests/support/stub_driver.py), and the environment under which the real
nvidia-ml-py (`import pynvml`) loads it: LD_LIBRARY_PATH naming the build directory first."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from tests.support.stub_driver import compiler

SOURCE = Path(__file__).resolve().parent
BUILD = SOURCE / "build"                 # ignored by .gitignore's build/
LIBRARY = "libnvidia-ml.so.1"
CFLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared", f"-Wl,-soname,{LIBRARY}")


def build(directory: Path = BUILD) -> Path | str:
    """The directory holding the built library (rebuilt when the source is newer), or the reason
    to skip where this machine has no C compiler."""
    cc = compiler()
    if cc is None:
        return "no C compiler (cc or gcc) on this machine to build tests/support/stub_nvml"
    library, source = directory / LIBRARY, SOURCE / "nvml.c"
    if library.is_file() and library.stat().st_mtime >= source.stat().st_mtime:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libnvml-", dir=directory)
    os.close(fd)
    done = subprocess.run([cc, *CFLAGS, "-o", tmp, str(source)], capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"tests/support/stub_nvml does not compile:\n{done.stderr[:4000]}")
    os.replace(tmp, library)
    return directory


def with_library(env: dict, directory: Path) -> dict:
    """`env` with the stub library's directory first on LD_LIBRARY_PATH."""
    out = dict(env)
    before = out.get("LD_LIBRARY_PATH")
    out["LD_LIBRARY_PATH"] = str(directory) + (os.pathsep + before if before else "")
    return out
