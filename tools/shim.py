"""The path shim behind `python3 -m tools.checkout`: `import coppelius` answered from the checkout.

It reads the mapping the wheel is built from (`[tool.setuptools.package-dir]` in pyproject.toml, one
table for both) and finds each mapped package (`coppelius` → host/, `coppelius.plan` → plan/, …) in
its folder; their submodules are then found through each package's `__path__` as usual.  The tools
mount it on import (tools/__init__.py), so `python -m tools.NAME` runs on a machine where nothing is
installed; where `coppelius` is importable already (an editable or a wheel install), it steps
aside.  Why a shim rather than an install: tools/checkout.py says.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "coppelius"


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """pyproject.toml's `[tool.setuptools.package-dir]`: import name → folder of the checkout."""
    with open(root / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items()}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds the mapped packages (`coppelius`, `coppelius.plan`, …) in the checkout's folders;
    their submodules are then found through each package's `__path__` as usual."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs

    def find_spec(self, fullname, path=None, target=None):
        folder = self.dirs.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


def mount(root: Path = ROOT) -> bool:
    """Make `import coppelius` read this checkout, unless a `coppelius` is importable already.
    True when the checkout was mounted."""
    if PACKAGE in sys.modules or any(isinstance(f, CheckoutFinder) for f in sys.meta_path):
        return False
    if importlib.util.find_spec(PACKAGE) is not None:
        return False
    sys.meta_path.insert(0, CheckoutFinder(package_dirs(root)))
    return True
