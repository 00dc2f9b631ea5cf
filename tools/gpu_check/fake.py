"""The device check's dry run: a module run with tools/fake_driver.py as the CUDA driver.

  python -m tools.gpu_check.fake [--no-triton] -m coppelius.cli doctor --profile tiny --json
  python -m tools.gpu_check.fake [--no-triton] -m tools.gpu_check.launches --profile tiny ...

The fake takes the place of `cuda.bindings.driver` (host/driver/calls.py's `_cu`, as the tests install
it), so the cuda backend's host logic runs on a machine without a GPU.  `--no-triton` makes any
import of triton or torch fail: what the device check runs this way must need neither, because the
GPU machine's Triton is not the project's pin.  The hook stays here, out of host/: it is the
check's, not the product's.  Run it from the repository root (or with it on PYTHONPATH), as the
check's runner does.
"""
from __future__ import annotations

import importlib.abc
import runpy
import sys

BLOCKED = ("triton", "torch")
USAGE = "usage: python -m tools.gpu_check.fake [--no-triton] -m MODULE [ARGS...]"


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses triton and torch (and their submodules) before any other finder sees them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ImportError(f"{name} is blocked by tools.gpu_check.fake --no-triton: this "
                              "step of the device check must not need it")
        return None


def install_fake_driver():
    """coppelius.driver.calls talks to a FakeDriver from here on; returns it."""
    from coppelius.driver import calls as drv
    from tools.fake_driver import FakeDriver
    fake = FakeDriver()
    drv._cu = fake
    return fake


def main(argv: list[str]) -> None:
    if argv[:1] == ["--no-triton"]:
        sys.meta_path.insert(0, _Blocker())
        argv = argv[1:]
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit(USAGE)
    install_fake_driver()
    module, rest = argv[1], argv[2:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
