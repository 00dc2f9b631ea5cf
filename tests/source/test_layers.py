"""The layers go one way, and every import of every module says so, read by `ast` (deferred imports
inside functions count too):

- between the folders: host → plan → staging (`coppelius` → `coppelius.plan` → `coppelius.staging`),
  and only tests and tools import tools;
- inside host/: the errors and the leaf modules at the bottom, the driver below the backends below
  the run below the command line; checkpoints and result files below the run; forensics never
  imports the command line, and no library module does (RANKS);
- no import circle among the product's modules; one alias per module, and an alias names one module;
- inside tools/: no sys.path edits (a tool runs as `python -m tools.NAME` from the repository root),
  no import circle, and no module uses another's private names."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from tests.support.paths import ROOT

PACKAGE = "coppelius"
# the folders of the checkout and the import names they are mapped to (pyproject's package-dir)
FOLDERS = {"host": PACKAGE, "plan": f"{PACKAGE}.plan", "staging": f"{PACKAGE}.staging"}
# a folder and the import names (prefixes) it may use from the product
ALLOWED = {"staging": (f"{PACKAGE}.staging",),
           "plan": (f"{PACKAGE}.plan", f"{PACKAGE}.staging"),
           "host": (PACKAGE,)}
TOOLS = "tools"
# inside host/: a module of a package may import its own package and packages of a lower rank only
RANKS = {"extras": -1,      # the optional dependency sets: imports nothing of coppelius
         "": 0, "errors": 0, "levels": 0, "tokenizer": 0, "slurm": 0, "telemetry": 0,
         "driver": 1, "checkpoints": 1,
         "results": 2, "backends": 2,
         "run": 3, "forensics": 3, "export": 3,
         "node": 3.5,       # runs `coppelius run` per GPU and judges with the forensics
         "cli": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in FOLDERS:
        parts = FOLDERS[parts[0]].split(".") + parts[1:]
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
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def layer_violations(folder: str, path: Path, source: str | None = None) -> list[str]:
    """Imports of a file of `folder` that reach above its layer, or into tools."""
    out = []
    for line, name in imported_modules(path, source):
        top = name.split(".")[0]
        if top in (TOOLS, *FOLDERS):
            out.append(f"{line}: {name} (the folder, not the `{PACKAGE}` package)")
        elif top == PACKAGE and not any(name == a or name.startswith(a + ".")
                                        for a in ALLOWED[folder]):
            out.append(f"{line}: {name}")
    return out


def host_package(module: str) -> str | None:
    """The host package a `coppelius.X...` module belongs to ('' for `coppelius` itself), or None
    for plan/staging and other modules."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1:
        return ""
    return None if parts[1] in ("plan", "staging", "kernels_ptx") else parts[1]


def rank_violations(path: Path, source: str | None = None) -> list[str]:
    """Imports of a host/ module that reach its own rank in another package, or a higher rank."""
    me = host_package(_module_name(path))
    out = []
    for line, name in imported_modules(path, source):
        other = host_package(name)
        if other is None or other == me:
            continue
        if other not in RANKS or me not in RANKS:
            out.append(f"{line}: {name} (a host package RANKS does not place)")
        elif RANKS[other] >= RANKS[me]:
            out.append(f"{line}: {name} ({other or PACKAGE} is rank {RANKS[other]}, "
                       f"{me or PACKAGE} rank {RANKS[me]})")
    return out


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_lower_layers_never_import_higher_ones(folder):
    files = _files(folder)
    assert files, f"no modules under {folder}/"
    bad = [f"{p.relative_to(ROOT)}:{v}" for p in files for v in layer_violations(folder, p)]
    assert not bad, "\n".join(bad)


def test_host_packages_import_only_below_themselves():
    files = _files("host")
    packages = {host_package(_module_name(p)) for p in files}
    assert packages <= set(RANKS), f"place every host package in RANKS: {packages - set(RANKS)}"
    bad = [f"{p.relative_to(ROOT)}:{v}" for p in files for v in rank_violations(p)]
    assert not bad, "\n".join(bad)


def test_the_import_reader_sees_relative_and_deferred_imports():
    """The checks above can fail: deferred and relative imports of higher layers are resolved."""
    source = ("from .errors import UserError\n"
              "def f():\n    from .. import run\n    import coppelius.plan.profiles as P\n"
              "    import plan.profiles\n")
    here = ROOT / "staging" / "x.py"
    names = sorted(n for _, n in imported_modules(here, source))
    assert names == ["coppelius", "coppelius.plan.profiles", "coppelius.staging.errors",
                     "plan.profiles"]
    assert layer_violations("staging", here, source) == [
        "3: coppelius", "4: coppelius.plan.profiles",
        "5: plan.profiles (the folder, not the `coppelius` package)"]
    driver = ROOT / "host" / "driver" / "x.py"
    src = ("from ..backends.base import Backend\nfrom coppelius.errors import DeviceError\n"
           "def f():\n    from coppelius.cli import main\n    from .calls import check\n")
    assert rank_violations(driver, src) == [
        "1: coppelius.backends.base (backends is rank 2, driver rank 1)",
        "4: coppelius.cli (cli is rank 4, driver rank 1)"]
    forensics = ROOT / "host" / "forensics" / "x.py"
    assert rank_violations(forensics, "from coppelius.run import loop\n") == [
        "1: coppelius.run (run is rank 3, forensics rank 3)"]


# ---------------------------------------------------------------- the product as a whole

def _product_modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS for p in _files(folder)}


def test_the_product_has_no_import_circle():
    modules = _product_modules()
    graph = {m: module_imports(p, modules) for m, p in modules.items()}
    assert graph["coppelius.run.loop"]                          # the reader sees them
    cycle = import_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def alias_clashes(files, sources: dict | None = None) -> list[str]:
    """An alias that names two modules, or a module imported under two aliases (`import m as a`,
    `from p import m as a`; a name imported from a module, not a module, is not an alias)."""
    by_alias, by_module = defaultdict(set), defaultdict(set)
    for path in files:
        source = (sources or {}).get(path)
        tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, ast.Import):
                pairs = [(a.name, a.asname) for a in node.names if a.asname]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                pairs = [(f"{node.module}.{a.name}", a.asname) for a in node.names if a.asname]
            for module, alias in pairs:
                by_alias[alias].add(module)
                by_module[module].add(alias)
    out = [f"alias {a} names {sorted(ms)}" for a, ms in sorted(by_alias.items()) if len(ms) > 1]
    out += [f"{m} imported as {sorted(als)}" for m, als in sorted(by_module.items())
            if len(als) > 1]
    # a name imported from a module is not a module: keep only module aliases that clash
    return out


def test_one_alias_per_module_and_one_module_per_alias():
    files = [p for folder in (*FOLDERS, TOOLS, "tests") for p in _files(folder)]
    bad = alias_clashes(files)
    assert not bad, "\n".join(bad)


def test_the_alias_check_can_fail():
    a, b = ROOT / "host" / "a.py", ROOT / "host" / "b.py"
    sources = {a: "from coppelius.staging import layout as L\n",
               b: "from coppelius.plan import launches as L\nimport numpy as np\n"}
    assert alias_clashes([a, b], sources) == [
        "alias L names ['coppelius.plan.launches', 'coppelius.staging.layout']"]
    sources[b] = "from coppelius.staging import layout as SL\n"
    assert alias_clashes([a, b], sources) == [
        "coppelius.staging.layout imported as ['L', 'SL']"]


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
    assert layer_violations("host", outside, "def f():\n    from tools.cost import lanes\n") == [
        "2: tools.cost (the folder, not the `coppelius` package)"]
