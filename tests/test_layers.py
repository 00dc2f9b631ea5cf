"""The layers go one way, host → plan → staging: every import of every module, read by `ast`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a package and the packages it must never import (deferred imports inside functions count too)
FORBIDDEN = {"staging": ("plan", "host"), "plan": ("host",)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import statement in a file, relative ones resolved."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.append((node.lineno, name))
    return out


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_never_import_higher_ones(package):
    files = _files(package)
    assert files, f"no modules under {package}/"
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}"
           for p in files for line, name in imported_modules(p)
           if name.split(".")[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def test_the_import_reader_sees_relative_and_deferred_imports():
    """The check above can fail: deferred and relative imports of higher layers are resolved."""
    source = ("from .errors import UserError\n"
              "def f():\n    from ..host import run\n    import plan.profiles as P\n")
    names = sorted(n for _, n in imported_modules(ROOT / "staging" / "x.py", source))
    assert names == ["host", "plan.profiles", "staging.errors"]
    names = [n for _, n in imported_modules(ROOT / "plan" / "kernels" / "x.py",
                                            "from ...host.driver import check\n")]
    assert names == ["host.driver"]
