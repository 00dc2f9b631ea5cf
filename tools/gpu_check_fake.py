"""The device check's dry run: a command line run with tests/fake_driver.py as the CUDA driver.

  python tools/gpu_check_fake.py [--no-triton] -m host.cli doctor --profile tiny --json
  python tools/gpu_check_fake.py [--no-triton] tools/gpu_check_launches.py --profile tiny ...

The fake takes the place of `cuda.bindings.driver` (host/driver.py's `_cu`, as the tests install
it), so the cuda backend's host logic runs on a machine without a GPU.  `--no-triton` makes any
import of triton or torch fail: what the device check runs this way must need neither, because the
GPU machine's Triton is not the project's pin.  The hook stays here, out of host/: it is the
check's, not the product's.
"""
from __future__ import annotations

import importlib.abc
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("triton", "torch")


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses triton and torch (and their submodules) before any other finder sees them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ImportError(f"{name} is blocked by tools/gpu_check_fake.py --no-triton: this "
                              "step of the device check must not need it")
        return None


def install_fake_driver():
    """host.driver talks to a FakeDriver from here on; returns it."""
    for p in (ROOT, ROOT / "tests"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    from fake_driver import FakeDriver

    from host import driver
    fake = FakeDriver()
    driver._cu = fake
    return fake


def main(argv: list[str]) -> None:
    if argv[:1] == ["--no-triton"]:
        sys.meta_path.insert(0, _Blocker())
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: gpu_check_fake.py [--no-triton] (-m MODULE | SCRIPT) [ARGS...]")
    install_fake_driver()
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = argv[0], argv[1:]
        sys.argv = [script, *rest]
        sys.path.insert(0, str(Path(script).resolve().parent))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
