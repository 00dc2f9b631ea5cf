"""The CUDA driver's rule: `cu()`, `check()`, `release()`, the bindings' version floor.

Driver API only (`from cuda.bindings import driver`), imported lazily so that every other part of the
host runs without a driver.  Works with the 12.x and 13.x bindings: the primary context avoids
`cuCtxCreate`, whose signature 13.x changed.  Every driver return goes through `check()`, which
turns it into its values or a `DriverError` naming the call; close paths go through `release()`,
which reports a failure as a warning instead of raising it.  The wrappers, one job per module, reach
the driver only through `cu()` and these two:
  host/driver/device.py   the device and its primary context, device memory, mapped staging, copies
  host/driver/stream.py   streams, events, graphs
  host/driver/module.py   PTX modules (the JIT), kernels and their launches

Bindings: cuda-bindings ≥ 12.9.1 (13.x: ≥ 13.0.0).  Those are the first releases whose driver calls
release the GIL ("Python bindings in every module, including driver, runtime, and nvrtc, now have the
GIL released before calling the underlying C APIs": cuda-bindings 12.9.1 and 13.0.0 release notes,
Aug 6, 2025); `cuda.bindings` itself exists since cuda-python 12.6.1 (Oct 7, 2024).  With older
bindings a publisher thread blocked in cuStreamSynchronize would hold the GIL and stall the run
loop's fence poll.  The bindings' major must not be newer than the driver's CUDA major: 12.x
bindings for a CUDA 12 driver, 13.x for a CUDA 13 driver (driver ≥ 580).
"""
from __future__ import annotations

import re
import shlex
import sys
import warnings

from coppelius.errors import BackendUnavailable, DeviceError
from coppelius.extras import checkout_root, install_command

_cu = None


def from_checkout() -> bool:
    """True when this `coppelius` is a checkout's host/ (an editable install, or
    `python3 -m tools.checkout`), beside the Makefile and pyproject.toml; False in a wheel."""
    return checkout_root() is not None


def install_hint(extra: str) -> str:
    """How to add an optional dependency set (`demo`, `text`, `hf`, ...), as a command that works
    as printed here: this interpreter's pip and the extra's requirements (coppelius.extras)."""
    return install_command(extra)


def _no_gpu_hint() -> str:
    tiny = "`coppelius run --profile tiny --backend interpret`"
    root = checkout_root()
    if root is not None:
        return (f"no GPU here: `make demo` in {root} runs the tiny profile on the CPU; or add "
                f"its dependencies to this Python: {install_hint('demo')}, then {tiny}")
    return f"no GPU here: the tiny profile runs on the CPU: {install_hint('demo')}, then {tiny}"


# true from the state `make run` (or a wheel) leaves on a machine without a GPU (tests/host/cli/
# test_cli.py and tests/package/test_first_hour_wheel.py run it)
NO_GPU_HINT = _no_gpu_hint()
BINDINGS_FLOOR = (12, 9, 1)     # pyproject.toml's floor; tests/host/backends/test_cuda_backend_fake.py ties the two
# this Python's pip, so that the command works as printed outside a virtual environment too
BINDINGS_HINT = (f"for a CUDA 12 driver: {shlex.quote(sys.executable)} -m pip install "
                 f"'cuda-bindings>=12.9.1,<13'; for a CUDA 13 driver: "
                 f"{shlex.quote(sys.executable)} -m pip install 'cuda-bindings>=13.0.0,<14'")


def cu():
    """The `cuda.bindings.driver` module, imported on first use."""
    global _cu
    if _cu is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:       # pragma: no cover - depends on the installation
            raise BackendUnavailable(f"cuda-bindings is not installed ({e})", BINDINGS_HINT) from None
        check_bindings_version(bindings_version())
        _cu = driver
    return _cu


def bindings_version() -> str | None:
    """`cuda.bindings.__version__`, or None where it cannot be read."""
    try:
        from cuda.bindings import __version__
        return str(__version__)
    except Exception:
        return None


def _release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


class BindingsMismatch(BackendUnavailable):
    """The installed cuda-bindings cannot drive this driver without stalls or failures."""


def check_bindings_version(version: str | None, driver_version: int | None = None) -> None:
    """Refuse bindings older than BINDINGS_FLOOR, or of a newer CUDA major than the driver."""
    if version is None:
        return
    release = _release_tuple(version)
    if release < BINDINGS_FLOOR:
        raise BindingsMismatch(f"cuda-bindings {version} holds the GIL in driver calls (released "
                               f"from {'.'.join(map(str, BINDINGS_FLOOR))}): a publisher thread "
                               "would stall the fence poll", BINDINGS_HINT)
    if driver_version and release and release[0] > driver_version // 1000:
        raise BindingsMismatch(f"cuda-bindings {version} needs a CUDA {release[0]} driver; this one "
                               f"is CUDA {driver_version // 1000}.{driver_version % 1000 // 10}",
                               BINDINGS_HINT)


class DriverError(DeviceError):
    """A driver call returned an error: names the call and the CUresult."""


class ReleaseWarning(RuntimeWarning):
    """A driver call on a close path failed; reported, not raised (the run's outcome stands)."""


def error_name(code) -> str:
    """The CUresult's name from the bindings' enum (no driver or device needed), else its number."""
    try:
        return cu().CUresult(int(code)).name
    except Exception:
        return f"CUresult {int(code)}"


def check(ret, call: str):
    """Turn a cuda-python return tuple `(CUresult, *values)` into the values, or raise."""
    if isinstance(ret, tuple):
        code, values = ret[0], ret[1:]
    else:
        code, values = ret, ()
    if int(code) != 0:
        raise DriverError(f"{error_name(code)} from {call}", int(code))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def release(ret, call: str) -> DriverError | None:
    """`check()` for a close path: a failure is reported as a ReleaseWarning and returned."""
    try:
        check(ret, call)
    except DriverError as e:
        warnings.warn(f"{e} (while releasing)", ReleaseWarning, stacklevel=2)
        return e
    return None


def pointer(handle) -> int:
    """The integer address of a CUdeviceptr / CUstream / host pointer."""
    return int(handle)
