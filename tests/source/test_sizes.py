"""The size limits of the product and its tools, read by `ast`: no file over 450 lines, no function
over 80, no class over 200 (a function or class by end_lineno - lineno + 1, a file by its lines)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.support.paths import ROOT

DIRECTORIES = ("host", "plan", "staging", "tools")
FILE_LINES = 450
FUNCTION_LINES = 80
CLASS_LINES = 200


def oversized(path: Path, source: str | None = None) -> list[str]:
    """One line per limit the file breaks: the file itself, then each function and class."""
    text = path.read_text() if source is None else source
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    out = []
    lines = len(text.splitlines())
    if lines > FILE_LINES:
        out.append(f"{name}: file of {lines} lines (limit {FILE_LINES})")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind, limit = "function", FUNCTION_LINES
        elif isinstance(node, ast.ClassDef):
            kind, limit = "class", CLASS_LINES
        else:
            continue
        size = node.end_lineno - node.lineno + 1
        if size > limit:
            out.append(f"{name}:{node.lineno}: {kind} {node.name} of {size} lines (limit {limit})")
    return out


def _files(directory: str) -> list[Path]:
    return sorted(p for p in (ROOT / directory).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("directory", DIRECTORIES)
def test_no_file_function_or_class_over_its_limit(directory):
    files = _files(directory)
    assert files, f"no Python files under {directory}/"
    offenders = [line for p in files for line in oversized(p)]
    assert not offenders, (f"{len(offenders)} over the size limits in {directory}/:\n"
                           + "\n".join(offenders))


def _function(name: str, lines: int) -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 2))
    return f"def {name}():\n{body}    return 0\n"


def _class(name: str, lines: int) -> str:
    return f"class {name}:\n" + "".join(f"    a{i} = {i}\n" for i in range(lines - 1))


def test_the_measure_sees_each_limit_and_not_one_line_less():
    """The check above can fail: one line over each limit is caught, exactly at it is not."""
    path = ROOT / "host" / "x.py"
    assert oversized(path, _function("fits", FUNCTION_LINES) + _class("Fits", CLASS_LINES)) == []
    found = oversized(path, _function("long", FUNCTION_LINES + 1) + _class("Big", CLASS_LINES + 1))
    assert found == [f"host/x.py:1: function long of {FUNCTION_LINES + 1} lines (limit 80)",
                     f"host/x.py:{FUNCTION_LINES + 2}: class Big of {CLASS_LINES + 1} lines "
                     "(limit 200)"], found
    assert oversized(path, "x = 0\n" * FILE_LINES) == []
    assert oversized(path, "x = 0\n" * (FILE_LINES + 1)) == [
        f"host/x.py: file of {FILE_LINES + 1} lines (limit 450)"]
