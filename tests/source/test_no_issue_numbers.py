"""Comments and docstrings give a reason, not a history: no .py file under host/, plan/, staging/,
tools/ or tests/ cites a tracker number, a work round or an issue's item in them.  Section citations
(CONTRACT §7, NUMERICS §AdamW) and the project's own sense of "issue" (one issue of a submission)
are not history and pass."""
from __future__ import annotations

import ast
import io
import re
import tokenize

import pytest
from tests.support.paths import ROOT

PACKAGES = ("host", "plan", "staging", "tools", "tests")
# a number after "issue" (or "issues", "issue #", "issue-"), a numbered round or item, a "(#N)"
CITATION = re.compile(r"\bissues?\s*[-#]?\s*\d+|\bround\s+\d+\b|\bitems?\s+\d+\b|\(#\d+\)",
                      re.IGNORECASE)


def _docstrings(tree: ast.AST):
    """(line, text) of the module's, every class's and every function's docstring."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                yield node.body[0].lineno, text


def _comments(source: str):
    """(line, text) of every comment."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def citations(source: str) -> list[tuple[int, str]]:
    """(line, the matched text) of every history citation in a file's comments and docstrings."""
    found = []
    for line, text in list(_docstrings(ast.parse(source))) + list(_comments(source)):
        found += [(line + text[:m.start()].count("\n"), m.group(0)) for m in CITATION.finditer(text)]
    return sorted(found, key=lambda hit: hit[0])        # by line, in reading order within one


def test_the_reader_catches_citations_and_passes_plain_text():
    # "@" keeps the samples themselves out of a grep for citations; it is dropped before reading
    cited = '''"""Issue @24: a module (issue #@7)."""
def f():
    """Why (issue @12 item @3); issues @3 and 17; the pre-issue-@17 form."""
    x = 1  # measured in round @5 (#@5)
    return "issue @14 in a string is data, not a comment"
'''.replace("@", "")
    want = ["Issue @24", "issue #@7", "issue @12", "item @3", "issues @3", "issue-@17", "round @5",
            "(#@5)"]
    assert [m for _, m in citations(cited)] == [w.replace("@", "") for w in want]
    assert [line for line, _ in citations(cited)] == [1, 1, 3, 3, 3, 3, 4, 4]
    plain = '''"""Rounds to nearest even; two rounds there; 5 rounds of 3 items.

The issue's input record, read once per issue; issues = steps + 2; CONTRACT §7, NUMERICS §5.
"""
x = 0x3F80  # round-to-nearest, rounded 3 times, issue #-less, item_3, see #5 below
'''
    assert citations(plain) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_comment_or_docstring_cites_an_issue(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no .py files under {package}/"
    bad = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in files
           for line, text in citations(p.read_text(encoding="utf-8"))]
    assert not bad, "history in comments or docstrings (say the reason instead):\n" + "\n".join(bad)
