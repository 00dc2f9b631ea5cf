"""The split host modules keep their old addresses: every driver wrapper is reachable through
host/driver.py, every name the checkpoint and result-file modules list resolves there."""
from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from host import checkpoint, driver, result_file

WRAPPER_MODULES = ("host.driver_device", "host.driver_stream", "host.driver_module")


def _defined(module) -> list[str]:
    """The public names a module's own top level defines: classes, functions, assignments."""
    tree = ast.parse(inspect.getsource(module))
    names = [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


@pytest.mark.parametrize("name", WRAPPER_MODULES)
def test_every_wrapper_is_reachable_through_the_driver_module(name):
    module = importlib.import_module(name)
    names = _defined(module)
    assert names, name
    missing = [n for n in names if getattr(driver, n, None) is not getattr(module, n)]
    assert not missing, f"{name}: not reachable as host.driver.<name>: {missing}"
    assert set(names) <= set(dir(driver))


def test_an_unknown_driver_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Devise'"):
        driver.Devise       # noqa: B018
    assert not hasattr(driver, "Devise")


@pytest.mark.parametrize("module", [checkpoint, result_file], ids=lambda m: m.__name__)
def test_every_listed_name_resolves(module):
    assert module.__all__
    assert [n for n in module.__all__ if not hasattr(module, n)] == []
