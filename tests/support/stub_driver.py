"""The C stub of libcuda.so.1 (tests/support/stub_cuda/): build it, the environment under which the real
cuda-bindings load it, and the violations it logged.

cuda-bindings 13.x finds the driver through cuda.pathfinder, which dlopens "libcuda.so.1" by the
system search: LD_LIBRARY_PATH naming the build directory is all a subprocess needs.  The bindings
then resolve every call through the stub's cuGetProcAddress_v2, so every host call goes through
the bindings' own argument handling.  The stub appends one line per violation to the file named
by COPPELIUS_STUB_LOG (and prints it to stderr), a LOADED line at cuInit and a STATS line at exit.

    python -m tests.support.stub_driver [--log PATH] -- COMMAND ...

runs COMMAND through the stub (the device check's GPU mode, say), then prints the violations and
exits 1 if there were any, else with COMMAND's status.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from tests.support.paths import ROOT, STUB_CUDA

SOURCE = STUB_CUDA
BUILD = SOURCE / "build"                 # ignored by .gitignore's build/
LIBRARY = "libcuda.so.1"
LOG_ENV = "COPPELIUS_STUB_LOG"
QUIET_ENV = "COPPELIUS_STUB_QUIET"       # "1": violations to the log only, not stderr
CC_ENV = "COPPELIUS_STUB_CC"             # "8.6": the stub device's compute capability (default 9.0)
EXECUTE_ENV = "COPPELIUS_STUB_EXECUTE"   # "1": processes attach the CPU executor (stub_execute/)
EXECUTE_SITE = Path(__file__).resolve().parent / "stub_execute"
CFLAGS = ("-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-shared",
          f"-Wl,-soname,{LIBRARY}")
VIOLATION, LOADED, STATS = "VIOLATION ", "LOADED ", "STATS "


def _defines() -> list[str]:
    """The layout sizes the stub's release kernels move, from staging/layout.py (where the host
    and the PTX agree on them), so no number is written twice."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from coppelius.staging import layout as L
    return [f"-DINPUT_RECORD_BYTES={L.INPUT_RECORD_BYTES}",
            f"-DSEMAPHORE_RECORD_BYTES={L.SEMAPHORE_RECORD_BYTES}",
            f"-DDOORBELL_BYTES={L.DOORBELL_BYTES}"]


def compiler() -> str | None:
    """The system C compiler ($CC, cc or gcc), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _stale(library: Path, stamp: Path, command: str) -> bool:
    if not library.is_file() or not stamp.is_file() or stamp.read_text() != command:
        return True
    built = library.stat().st_mtime
    return any(p.stat().st_mtime > built for p in SOURCE.glob("*.[ch]"))


class StubBuildFailed(RuntimeError):
    """The stub's C does not compile: a failure to fix, not a reason to skip."""


def build(directory: Path = BUILD) -> Path | str:
    """The directory holding the built libcuda.so.1 (rebuilt when a source or the command is
    newer), or the reason to skip where this machine has no C compiler.  Raises StubBuildFailed
    with the compiler's output when the source does not compile."""
    cc = compiler()
    if cc is None:
        return "no C compiler (cc or gcc) on this machine to build tests/support/stub_cuda"
    sources = sorted(str(p) for p in SOURCE.glob("*.c"))
    args = [cc, *CFLAGS, *_defines(), "-o"]
    library, stamp = directory / LIBRARY, directory / "command.txt"
    command = " ".join(args + sources)
    if not _stale(library, stamp, command):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libcuda-", dir=directory)
    os.close(fd)
    done = subprocess.run(args + [tmp] + sources + ["-lpthread"], capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise StubBuildFailed(f"tests/support/stub_cuda does not compile:\n{done.stderr.strip()[:4000]}")
    os.replace(tmp, library)            # atomic: a concurrent build or load sees either file
    stamp.write_text(command)
    return directory


def built_or_skip() -> Path:
    """The built stub's directory for a test, or the test skipped naming why (no compiler, or no
    cuda-bindings to load it)."""
    import pytest
    lib = build()
    if isinstance(lib, str):
        pytest.skip(lib)
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    return lib


def env(log_path: Path | str, directory: Path = BUILD, base: dict | None = None,
        execute: bool = False, **extra) -> dict:
    """The environment of a subprocess whose cuda-bindings load the stub: LD_LIBRARY_PATH first
    names the build directory, COPPELIUS_STUB_LOG the log; `execute`: every Python process under
    it attaches the CPU executor to the stub at start-up (stub_execute/sitecustomize.py), so its
    Triton launches compute; `extra`: COPPELIUS_STUB_* settings."""
    out = dict(os.environ if base is None else base)
    before = out.get("LD_LIBRARY_PATH")
    out["LD_LIBRARY_PATH"] = str(directory) + (os.pathsep + before if before else "")
    out[LOG_ENV] = str(log_path)
    if execute:
        path = out.get("PYTHONPATH")
        out["PYTHONPATH"] = os.pathsep.join([str(EXECUTE_SITE), str(ROOT)]
                                            + ([path] if path else []))
        out[EXECUTE_ENV] = "1"
    out.pop("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", None)
    out.update({k: str(v) for k, v in extra.items()})
    return out


def _lines(log_path: Path | str, prefix: str) -> list[str]:
    path = Path(log_path)
    if not path.is_file():
        return []
    return [line for line in path.read_text().splitlines() if line.startswith(prefix)]


def violations(log_path: Path | str) -> list[str]:
    """Every violation the stub logged there, one line each, in order."""
    return _lines(log_path, VIOLATION)


def loaded(log_path: Path | str) -> int:
    """How many processes initialized the stub (cuInit) with this log."""
    return len(_lines(log_path, LOADED))


def stats(log_path: Path | str) -> dict[str, int]:
    """The STATS counters summed over every process that logged there (launches, captured,
    programmatic, graph_launches, released, staged, copied_kernels, copies, copy_bytes, memsets,
    violations)."""
    total: dict[str, int] = {}
    for line in _lines(log_path, STATS):
        for field in line.split()[2:]:
            key, value = field.split("=")
            total[key] = total.get(key, 0) + int(value)
    return total


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="run a command with the stub as libcuda.so.1")
    p.add_argument("--log", type=Path, help="violation log (default: a temporary file)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command")
    lib = build()
    if isinstance(lib, str):
        print(f"stub driver unavailable: {lib}", file=sys.stderr)
        return 2
    log = args.log or Path(tempfile.mkstemp(prefix="coppelius-stub-", suffix=".log")[1])
    rc = subprocess.run(command, env=env(log, lib)).returncode
    found = violations(log)
    print(f"stub driver: {len(found)} violation(s), {loaded(log)} process(es), log {log}",
          file=sys.stderr)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
