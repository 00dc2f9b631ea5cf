"""The checkout as the `coppelius` command with nothing installed: `python3 -m tools.checkout COMMAND`.

For a GPU machine whose Python already has the runtime dependencies (cuda-bindings, numpy, rich; cffi
is optional) and no package index: from the repository root, `python3 -m tools.checkout doctor` is
`coppelius doctor`, and so on for every command.  Nothing is built, installed or downloaded.

Why a path shim rather than `pip install --no-index --no-build-isolation .`: that needs setuptools ≥ 68
in the machine's Python and resolves the dependencies, so it fails where cffi is missing (the GPU
image has none: the host falls back to ctypes) unless told `--no-deps`, and it writes into that
Python's site-packages.  The shim reads the same mapping the wheel is built from
(`[tool.setuptools.package-dir]` in pyproject.toml, one table for both: tools/shim.py) and answers
imports of `coppelius` and its mapped subpackages from the checkout's folders, so the checkout runs
exactly the code a wheel would hold.  Where `coppelius` is importable already (an editable or a wheel
install), the shim steps aside and the installed one is used.
"""
from __future__ import annotations

import sys

from tools import shim


def main(argv: list[str] | None = None) -> int:
    shim.mount()
    from coppelius.cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
