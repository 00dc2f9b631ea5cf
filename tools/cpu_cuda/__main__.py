"""`python -m tools.cpu_cuda [--order O] COMMAND ARGS...`: `coppelius COMMAND ARGS...` with the
executing fake driver standing in for the GPU (tools/cpu_cuda/__init__.py)."""
from __future__ import annotations

import sys

from tools.fake_driver import ORDERS

USAGE = ("usage: python -m tools.cpu_cuda [--order capture|earliest|latest|random:SEED] "
         "COMMAND ARGS...   (e.g. run --profile tiny --backend cuda --steps 3)")


def install(order: str = "capture"):
    """The executing fake driver as this process's CUDA driver (coppelius.driver.calls's `_cu`,
    which the tests' fixture sets the same way); returns it."""
    from coppelius.driver import calls as drv
    from tools.fake_driver import FakeDriver
    fake = FakeDriver(execute=True, order=order)
    drv._cu = fake
    return fake


def main(argv: list[str]) -> int:
    order = "capture"
    if argv[:1] == ["--order"]:
        if len(argv) < 2 or not (argv[1] in ORDERS or argv[1].startswith("random:")):
            print(USAGE, file=sys.stderr)
            return 2
        order, argv = argv[1], argv[2:]
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    install(order)
    from coppelius.cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
