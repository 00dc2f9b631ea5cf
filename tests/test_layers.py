"""The layers go one way, host → plan → staging, and only tests and tools import tools: every
import of every module, read by `ast`.  Inside tools/: no sys.path edits (a tool runs as
`python -m tools.NAME` from the repository root), no import circle, and no module uses another's
private names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a package and the packages it must never import (deferred imports inside functions count too)
FORBIDDEN = {"staging": ("plan", "host", "tools"), "plan": ("host", "tools"), "host": ("tools",)}
TOOLS = "tools"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_module(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement of a file imports from."""
    if not node.level:
        return node.module
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import statement in a file, relative ones resolved."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, _from_module(path, node)))
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


# ---------------------------------------------------------------- tools/

def _tool_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files(TOOLS)}


def tools_importing_outside() -> list[str]:
    """Modules outside tests/ and tools/ (every .py of the checkout) that import tools."""
    skip = {".venv", ".git", "tests", TOOLS, "build"}
    files = [p for p in sorted(ROOT.rglob("*.py")) if not skip & set(p.relative_to(ROOT).parts)]
    return [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in files
            for line, name in imported_modules(p) if name.split(".")[0] == TOOLS]


def sys_path_edits(path: Path, source: str | None = None) -> list[int]:
    """Lines that change sys.path: a call of one of its methods, an assignment or an augmented
    assignment to it, or site.addsitedir."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))

    def is_sys_path(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if is_sys_path(f.value) or (f.attr == "addsitedir" and isinstance(f.value, ast.Name)
                                        and f.value.id == "site"):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def module_imports(path: Path, modules, source: str | None = None) -> set[str]:
    """The modules of `modules` that a file imports (`from pkg import mod` names pkg.mod)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    out = {name for _, name in imported_modules(path, source)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out |= {f"{_from_module(path, node)}.{a.name}" for a in node.names}
    return {m for m in out if m in modules and m != _module_name(path)}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the import graph (module → the modules it imports), or None."""
    state: dict[str, int] = {}           # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None
    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def private_uses(path: Path, modules, source: str | None = None) -> list[str]:
    """`from M import _x` and `m._x` where M / m is another module of `modules`."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    me = _module_name(path)

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")
    aliases, out = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _from_module(path, node)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif base in modules and base != me and private(a.name):
                    out.append(f"{node.lineno}: {a.name} from {base}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != me):
            out.append(f"{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return out


def test_only_tests_and_tools_import_tools():
    assert not tools_importing_outside(), "\n".join(tools_importing_outside())


def test_no_tool_edits_sys_path():
    files = _files(TOOLS)
    assert files, "no modules under tools/"
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in sys_path_edits(p)]
    assert not bad, "a tool runs as `python -m tools.NAME` from the root; edits: " + ", ".join(bad)


def test_tools_have_no_import_circle():
    modules = _tool_modules()
    graph = {m: module_imports(p, modules) for m, p in modules.items()}
    assert graph["tools.cost.lanes"] and graph["tools.gpu_check.check"]     # the reader sees them
    cycle = import_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_tool_uses_another_modules_private_names():
    modules = _tool_modules()
    bad = [f"{p.relative_to(ROOT)}:{use}" for p in modules.values()
           for use in private_uses(p, modules)]
    assert not bad, "\n".join(bad)


def test_the_tools_checks_can_fail():
    """Each tools/ check above finds what it is for in a source written to break it."""
    here = ROOT / TOOLS / "cost" / "x.py"
    edits = ("import sys, site\nsys.path.insert(0, 'a')\nsys.path = []\nsys.path[:0] = ['b']\n"
             "sys.path += ['c']\nsite.addsitedir('d')\nprint(sys.path)\n")
    assert sys_path_edits(here, edits) == [2, 3, 4, 5, 6]
    modules = {"tools.cost.x", "tools.cost.lanes", "tools.cost.per_launch", "tools.gpu_check.fake"}
    src = ("from . import lanes\nfrom .per_launch import _Per, cost\nimport tools.gpu_check.fake as F\n"
           "def f():\n    from tools.cost import per_launch as pl\n"
           "    return lanes._Launch, pl._Per, F.__doc__, F._Blocker, lanes.schedule\n")
    assert module_imports(here, modules, src) == {"tools.cost.lanes", "tools.cost.per_launch",
                                                  "tools.gpu_check.fake"}
    assert sorted(private_uses(here, modules, src)) == [
        "2: _Per from tools.cost.per_launch", "6: tools.cost.lanes._Launch",
        "6: tools.cost.per_launch._Per", "6: tools.gpu_check.fake._Blocker"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None
    outside = ROOT / "host" / "x.py"
    assert [n for _, n in imported_modules(outside, "def f():\n    from tools.cost import lanes\n")] \
        == ["tools.cost"]
