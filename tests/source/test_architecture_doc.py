"""docs/ARCHITECTURE.md against the tree: the mirror table row by row, and every reference its
trace makes.

The mirror table has one row per kind of launch.  Every launch of every submission of both
profiles must match exactly one row's label pattern, in a submission and on a lane the row
names, with the kernel (module and function) the row names; and every cell must name something
that exists: the reference stage in plan/reference/ (`coppelius.plan.reference`), the NUMERICS.md
row, the kernel function in its file (read with ast: no Triton import), the cost model's family
(tools/cost REGISTRY, keyed by the Triton function name), the production oracle registered from the
named tests/support/production/ module (or the harness's reason for a hand-written kernel), and a
test file that mentions the kernel.
Every `` `path.py: name` `` reference in the document resolves to a definition in that file.
A file's import name comes from pyproject's package-dir table (the wheel's and the checkout
shim's mapping), so `plan/kernels/matmul.py` is `coppelius.plan.kernels.matmul`, and a file outside
the mapped folders keeps its path (`tests/support/production/norms.py` is
`tests.support.production.norms`).
"""
from __future__ import annotations

import ast
import importlib
import re
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
from tests.support.production.harness import REGISTRY as ORACLES
from tests.support.production.harness import SKIPPED

from coppelius.plan import launches, profiles
from tools.cost.kernels import REGISTRY as COST
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
NUMERICS = ROOT / "docs" / "NUMERICS.md"
TABLE_HEADING = "## The mirror table"
COLUMNS = ("launch", "in", "lane", "reference stage", "numerics", "kernel", "cost family",
           "oracle", "test")
LANES = {"main": launches.MAIN_LANE, "side": launches.SIDE_LANE}
NONE = "—"
# kernels that move or pick values and compute no model math: no reference stage, no NUMERICS row
DATA_MOVEMENT = {"copy_f32", "predictions", launches.RELEASE, launches.STAGE_IN}
REF = re.compile(r"`([\w./]+\.(?:py|ptx)): ([\w.]+)`")
TICKED = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"\\\{\w+\\\}")          # `{i}` in a label pattern, once escaped
# a reference stage cell names `module.function` under the plan's reference package
STAGES = "coppelius.plan"
STAGE_MODULE = "reference.stages"        # the stages proper: each needs its NUMERICS row


# ------------------------------------------------------------------------------- reading

@lru_cache(maxsize=1)
def _mapped_folders() -> tuple[tuple[tuple[str, ...], str], ...]:
    """(folder parts, import name) for pyproject's package-dir table, deepest folder first."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    dirs = [(Path(folder).parts, name) for name, folder in table.items()]
    return tuple(sorted(dirs, key=lambda d: -len(d[0])))


def module_name(path: str) -> str:
    """The import name of a .py file of the checkout: `plan/kernels/adamw.py` →
    `coppelius.plan.kernels.adamw`; a file outside the mapped folders keeps its path's dots."""
    parts = tuple(Path(path[:-len(".py")]).parts)
    for folder, name in _mapped_folders():
        if parts[:len(folder)] == folder:
            parts = tuple(name.split(".")) + parts[len(folder):]
            break
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def mirror_rows(text: str) -> list[dict]:
    """The mirror table's rows: {column: cell, "line": n}; refuses a table with other columns."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADING))
    head = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    columns = tuple(_cells(lines[head]))
    if tuple(c.lower() for c in columns) != COLUMNS:
        raise ValueError(f"mirror table columns {columns}, expected {COLUMNS}")
    rows, i = [], head + 2
    while i < len(lines) and lines[i].startswith("|"):
        rows.append(dict(zip(COLUMNS, _cells(lines[i])), line=i + 1))
        i += 1
    return rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def ticked(cell: str) -> list[str]:
    return TICKED.findall(cell)


def label_pattern(pattern: str) -> re.Pattern:
    """`layers.{i}.qkv+rotary` → a regex in which each `{name}` is a decimal index."""
    return re.compile(PLACEHOLDER.sub(r"\\d+", re.escape(pattern)))


def numerics_rows(text: str) -> set[str]:
    """The stage names NUMERICS.md defines: a table row's bold first cell, or a `stage **x**`."""
    return set(re.findall(r"^\| \*\*(\w+)\*\* \|", text, re.M)) | \
        set(re.findall(r"stage \*\*(\w+)\*\*", text))


@lru_cache(maxsize=None)
def definitions(path: str) -> frozenset[str]:
    """Names a Python file defines at top level, and `Class.member` for its classes' members
    (ast, so a kernel file is read without importing Triton); a .ptx file's `.entry` names."""
    source = (ROOT / path).read_text(encoding="utf-8")
    if path.endswith(".ptx"):
        return frozenset(re.findall(r"\.entry\s+(\w+)", source))
    out = set()
    for node in ast.parse(source).body:
        out.update(_names(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                out.update(f"{node.name}.{n}" for n in _names(member))
    return frozenset(out)


def _names(node) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


# ------------------------------------------------------------------------------- checks

def reference_problems(text: str) -> list[str]:
    """Every `path: name` reference names a file that exists and defines that name."""
    out = []
    for path, name in REF.findall(re.sub(r"\s+", " ", text)):    # a reference may wrap a line
        if not (ROOT / path).is_file():
            out.append(f"`{path}: {name}`: no file {path}")
        elif name not in definitions(path):
            out.append(f"`{path}: {name}`: {path} defines no {name}")
    return out


def cell_problems(row: dict, stages: set[str]) -> list[str]:
    """What a row's cells name exists (its kernel's agreement with the plan is coverage's)."""
    where = f"line {row['line']} ({row['launch']})"
    out = []
    kernel = REF.findall(row["kernel"])
    if len(kernel) != 1:
        return [f"{where}: the kernel cell names no `path: function`"]
    function = kernel[0][1]
    out += _reference_stage_problems(where, row, function)
    named = ticked(row["numerics"])
    out += [f"{where}: NUMERICS.md has no row {n!r}" for n in named if n not in stages]
    if not named and function not in DATA_MOVEMENT:
        out.append(f"{where}: no NUMERICS row for {function}, which computes")
    for fam in ticked(row["cost family"]):
        if fam not in COST:
            out.append(f"{where}: the cost model has no family {fam!r}")
        elif fam != function:
            out.append(f"{where}: cost family {fam!r} is not the kernel's function {function!r}")
    out += _oracle_problems(where, row, function)
    for test in ticked(row["test"]):
        path = ROOT / test
        if not path.is_file():
            out.append(f"{where}: no test file {test}")
        elif not re.search(rf"\b{re.escape(function)}\b", path.read_text(encoding="utf-8")):
            out.append(f"{where}: {test} does not mention {function}")
    if not ticked(row["test"]):
        out.append(f"{where}: no test named")
    return out


def _reference_stage_problems(where: str, row: dict, function: str) -> list[str]:
    out = []
    named = ticked(row["reference stage"])
    if not named and function not in DATA_MOVEMENT:
        out.append(f"{where}: no reference stage for {function}, which computes")
    numerics = set(ticked(row["numerics"]))
    for ref in named:
        module, _, name = ref.rpartition(".")
        try:
            found = hasattr(importlib.import_module(f"{STAGES}.{module}"), name)
        except ImportError:
            found = False
        if not found:
            out.append(f"{where}: no reference stage {STAGES}.{ref}")
        elif module == STAGE_MODULE and name not in numerics:
            out.append(f"{where}: reference stage {name} has no NUMERICS row in this row")
    return out


def _oracle_problems(where: str, row: dict, function: str) -> list[str]:
    """The oracle cell names the tests/support/production/ module that registers the kernel's
    function (`@oracle("function")`), or says "—" for a kernel the harness skips with a reason."""
    named = ticked(row["oracle"])
    if not named:
        ok = row["oracle"].startswith(NONE) and function in SKIPPED
        return [] if ok else [f"{where}: no oracle named for {function}"]
    if not (ROOT / named[0]).is_file():
        return [f"{where}: no oracle module {named[0]}"]
    module = module_name(named[0])
    if function not in ORACLES:
        return [f"{where}: no oracle registered for {function!r}"]
    if type(ORACLES[function]).__module__ != module:
        return [f"{where}: {function}'s oracle is registered in "
                f"{type(ORACLES[function]).__module__}, not {module}"]
    return []


def coverage_problems(rows: list[dict], subs: dict) -> list[str]:
    """Every launch matches exactly one row, whose submissions, lane and kernel are its own;
    every row matches a launch in each submission it names, and in no other."""
    out, seen = [], {id(r): set() for r in rows}
    patterns = [(r, [label_pattern(p) for p in ticked(r["launch"])]) for r in rows]
    for (profile, name), sub in subs.items():
        for launch in sub.launches:
            hits = [r for r, ps in patterns if any(p.fullmatch(launch.label) for p in ps)]
            where = f"{profile} {name} launch {launch.label!r}"
            if len(hits) != 1:
                out.append(f"{where}: matches {len(hits)} rows of the mirror table")
                continue
            row = hits[0]
            seen[id(row)].add(name)
            out += _launch_row_problems(where, launch, row)
    for row in rows:
        named = {s.strip() for s in row["in"].split(",")}
        if seen[id(row)] != named:
            out.append(f"line {row['line']} ({row['launch']}): in {sorted(named)}, but its "
                       f"launches are in {sorted(seen[id(row)])}")
    return out


def _launch_row_problems(where: str, launch, row: dict) -> list[str]:
    out = []
    kernel = REF.findall(row["kernel"])
    path, function = kernel[0] if kernel else ("", "")
    module = module_name(path) if path.endswith(".py") else ""
    if (module, function) != (launch.module, launch.function):
        out.append(f"{where} runs {launch.module or 'PTX'}:{launch.function}, the row names "
                   f"{path}: {function}")
    if LANES.get(row["lane"]) != launch.lane:
        out.append(f"{where} is on lane {launch.lane}, the row says {row['lane']!r}")
    return out


def problems(text: str, numerics: str) -> list[str]:
    rows = mirror_rows(text)
    stages = numerics_rows(numerics)
    subs = {(p, s.name): s for p in ("coppelius", "tiny")
            for s in launches.submissions(profiles.get(p))}
    out = reference_problems(text) + coverage_problems(rows, subs)
    for row in rows:
        out += cell_problems(row, stages)
    return out


# ------------------------------------------------------------------------------- tests

def _texts() -> tuple[str, str]:
    return DOC.read_text(encoding="utf-8"), NUMERICS.read_text(encoding="utf-8")


def test_the_mirror_table_and_the_trace_hold():
    found = problems(*_texts())
    assert not found, "docs/ARCHITECTURE.md:\n" + "\n".join(found)


def test_the_table_has_a_row_per_kind_of_launch_and_no_more():
    rows = mirror_rows(_texts()[0])
    labels = [p for r in rows for p in ticked(r["launch"])]
    assert len(labels) == len(set(labels)), "a label pattern in two rows"
    assert len(rows) >= 30, f"{len(rows)} rows: the table lost kinds of launch"


def _with_cell(text: str, label: str, column: str, cell: str) -> str:
    """The document with one cell of the row whose launch cell holds `label` replaced."""
    lines = text.splitlines()
    row = next(r for r in mirror_rows(text) if f"`{label}`" in r["launch"])
    cells = _cells(lines[row["line"] - 1])
    cells[COLUMNS.index(column)] = cell
    lines[row["line"] - 1] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines) + "\n"


WRONG_CELLS = [
    ("layers.{i}.qkv+rotary", "launch", "`layers.{i}.qkv`", "matches 0 rows"),
    ("layers.{i}.qkv+rotary", "in", "forward, update", "launches are in"),
    ("layers.{i}.qkv+rotary", "lane", "side", "the row says 'side'"),
    ("layers.{i}.qkv+rotary", "reference stage", "`reference.stages.qkv_fwd`",
     "no reference stage coppelius.plan.reference.stages.qkv_fwd"),
    ("layers.{i}.qkv+rotary", "numerics", "`qkv`", "rotary has no NUMERICS row"),
    ("layers.{i}.qkv+rotary", "numerics", "`qkv`, `rotary`, `rope`", "no row 'rope'"),
    ("layers.{i}.qkv+rotary", "kernel", "`plan/kernels/matmul.py: matmul_rotery`",
     "defines no matmul_rotery"),
    ("layers.{i}.qkv+rotary", "kernel", "`plan/kernels/norms.py: matmul_rotary`",
     "defines no matmul_rotary"),
    ("layers.{i}.qkv+rotary", "kernel", "`plan/kernels/attention.py: attention_fwd`",
     "runs coppelius.plan.kernels.matmul:matmul_rotary, the row names"),
    ("layers.{i}.qkv+rotary", "cost family", "`matmul`", "is not the kernel's function"),
    ("layers.{i}.qkv+rotary", "cost family", "`matmul_rotery`", "no family 'matmul_rotery'"),
    ("layers.{i}.qkv+rotary", "oracle", "`tests/support/production/norms.py`",
     "not tests.support.production.norms"),
    ("layers.{i}.qkv+rotary", "oracle", "`tests/support/production/rotary.py`", "no oracle module"),
    ("layers.{i}.qkv+rotary", "oracle", NONE, "no oracle named"),
    ("layers.{i}.qkv+rotary", "test", "`tests/plan/test_kernels_rows.py`", "does not mention"),
    ("layers.{i}.qkv+rotary", "test", "`tests/plan/test_kernels_rotary.py`", "no test file"),
    ("cross_entropy", "reference stage", NONE, "no reference stage for cross_entropy"),
]


@pytest.mark.parametrize("label, column, cell, message", WRONG_CELLS,
                         ids=[f"{c[1]}={c[2]}" for c in WRONG_CELLS])
def test_a_wrong_cell_is_caught(label, column, cell, message):
    text, numerics = _texts()
    found = problems(_with_cell(text, label, column, cell), numerics)
    assert any(message in p for p in found), f"{message!r} not among {found}"


def test_a_missing_row_and_a_wrong_trace_reference_are_caught():
    text, numerics = _texts()
    row = next(r for r in mirror_rows(text) if "`embed`" in r["launch"])
    lines = text.splitlines()
    del lines[row["line"] - 1]
    found = problems("\n".join(lines) + "\n", numerics)
    assert any("'embed': matches 0 rows" in p for p in found), found
    ref = "`host/run/ring.py: Ring.wait`"
    assert ref in text
    found = problems(text.replace(ref, "`host/run/ring.py: Ring.wiat`"), numerics)
    assert any("defines no Ring.wiat" in p for p in found), found
