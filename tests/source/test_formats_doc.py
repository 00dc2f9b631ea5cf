"""docs/FORMATS.md against the code, row by row; docs/CONTRACT.md's sections against the references.

Every FORMATS.md table with an `offset`, a `size` and a `code` column is parsed; each row's code
references (`` `path.py: expression` ``) are resolved in that module (its import name from
pyproject's package-dir table, the wheel's and the checkout shim's: `staging/records.py` is
`coppelius.staging.records`) and must give the row's offset and size: a record's `NAME.field` is
its numpy dtype field (offset, itemsize, and the type cell); `StagingViews.x` is the view's place
in a real staging buffer; anything else is evaluated in the module (plus the two profiles) to an
(offset, size) pair or a profile parameter. The checkpoint header rows are also read back from an
encoded header, the size formula is checked for both profiles, and the worked example is run and
its output compared with the one pasted in the doc.
"""
from __future__ import annotations

import hashlib
import importlib
import re
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from coppelius.checkpoints import format as CF
from coppelius.plan import profiles
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS
from coppelius.staging import tokens as tk
from coppelius.staging import views as SV
from tests.support.paths import ROOT

FORMATS = ROOT / "docs" / "FORMATS.md"
CONTRACT = ROOT / "docs" / "CONTRACT.md"
GOLDEN = ROOT / "tests" / "golden" / "tiny-result-c0.bin"
PROFILES = {"COPPELIUS": profiles.COPPELIUS, "TINY": profiles.TINY}
REF = re.compile(r"`([\w/]+\.py): ([^`]+)`")
FIELD = re.compile(r"^([A-Za-z_]\w*)\.([a-z_]\w*)$")
VIEW = re.compile(r"^StagingViews(?:\((COPPELIUS|TINY)\))?\.(\w+)$")
TYPE = re.compile(r"^(u8|u16|u32|u64|i64|f32|ascii)((?:\[\d+\])*)$")
BASES = {"u8": "u1", "u16": "<u2", "u32": "<u4", "u64": "<u8", "i64": "<i8", "f32": "<f4"}
# the sections of CONTRACT.md: the numbering the code's section references use
CONTRACT_SECTIONS = {
    1: "What the program does", 2: "Run policy", 3: "The model", 4: "Learner and initialization",
    5: "Token stream", 6: "The staging region",
    7: "The plan: submissions, semaphores, fences, timestamps", 8: "Host records",
    9: "The result file", 10: "The checkpoint file", 11: "Backends and the reference",
    12: "Kernels and PTX", 13: "The command line", 14: "The embedded default stream"}
SECTION_SIGN = "\u00a7"
CITATION = re.compile(r"\b(?:SPEC|CONTRACT)\s+\u00a7(\d+)"
                      r"((?:\s*(?:[\u2013-]|,|and)\s*\u00a7\d+)*)")
SCANNED = ("host", "plan", "staging", "tools", "tests", "docs")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".ptx", ".txt", ".toml", ".cfg"}


# ------------------------------------------------------------------------------------ parsing
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> list[dict]:
    """Every markdown table: {"heading", "columns", "rows": [{column: cell, "line": n}]}."""
    tables, heading, lines, i = [], "", text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            columns = [c.lower() for c in _cells(line)]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(columns, _cells(lines[i])), line=i + 1))
                i += 1
            tables.append({"heading": heading, "columns": columns, "rows": rows})
            continue
        i += 1
    return tables


def checked_tables(text: str) -> list[dict]:
    return [t for t in parse_tables(text) if {"offset", "size", "code"} <= set(t["columns"])]


def doc_rows(text: str | None = None) -> list[dict]:
    text = FORMATS.read_text(encoding="utf-8") if text is None else text
    return [dict(r, heading=t["heading"]) for t in checked_tables(text) for r in t["rows"]]


def parse_type(cell: str) -> np.dtype | None:
    """'u32' → <u4, 'u32[3][2]' → (<u4, (3, 2)), 'ascii[40]' → S40; None for anything else."""
    m = TYPE.match(cell.strip("`"))
    if not m:
        return None
    shape = tuple(int(n) for n in re.findall(r"\d+", m[2]))
    if m[1] == "ascii":
        return np.dtype(f"S{shape[0]}") if len(shape) == 1 else None
    return np.dtype((BASES[m[1]], shape)) if shape else np.dtype(BASES[m[1]])


# ----------------------------------------------------------------------------------- resolving
def module_name(path: str) -> str:
    """`staging/records.py` → `coppelius.staging.records`: the deepest mapped folder of
    pyproject's package-dir table gives the prefix; a file outside them keeps its path's dots."""
    parts = Path(path.removesuffix(".py")).parts
    with open(ROOT / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    mapped = sorted(((Path(folder).parts, name) for name, folder in table.items()),
                    key=lambda d: -len(d[0]))
    for folder, name in mapped:
        if parts[:len(folder)] == folder:
            parts = (*name.split("."), *parts[len(folder):])
            break
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module(path: str):
    return importlib.import_module(module_name(path))


def _dtype_of(obj) -> np.dtype | None:
    if isinstance(obj, R.Record):
        return obj.dtype
    return obj if isinstance(obj, np.dtype) else None


def _view_span(profile_name: str | None, name: str) -> tuple[int, int]:
    raw = SV.allocate_host()
    views = SV.StagingViews(raw, PROFILES[profile_name or "COPPELIUS"])
    arr = getattr(views, name)
    return arr.ctypes.data - raw.ctypes.data, arr.nbytes


def resolve(path: str, expr: str) -> tuple[int, int, np.dtype | None]:
    """(offset, size, dtype of a record field or None) that a code reference names."""
    mod = _module(path)
    m = FIELD.match(expr)
    if m and _dtype_of(getattr(mod, m[1], None)) is not None:
        field_type, offset = _dtype_of(getattr(mod, m[1])).fields[m[2]][:2]
        return offset, field_type.itemsize, field_type
    whole = _dtype_of(getattr(mod, expr, None)) if expr.isidentifier() else None
    if whole is not None:
        return 0, whole.itemsize, None
    m = VIEW.match(expr)
    if m and path == "staging/views.py":
        return (*_view_span(m[1], m[2]), None)
    value = eval(expr, {"__builtins__": {"len": len}}, {**vars(mod), **PROFILES})  # noqa: S307
    if isinstance(value, profiles.Parameter):
        return (value.offset * profiles.BYTES_PER_SCALAR, value.size * profiles.BYTES_PER_SCALAR,
                None)
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ValueError(f"{path}: {expr} is {value!r}, not (offset, size)")
    return int(value[0]), int(value[1]), None


def row_problems(row: dict) -> list[str]:
    """What is wrong with one table row (empty when every reference agrees with its cells)."""
    where = f"FORMATS.md:{row['line']} ({row['heading']}: {row.get('field', '?')})"
    refs = REF.findall(row["code"])
    if not refs:
        return [f"{where}: no code reference in {row['code']!r}"]
    try:
        offset, size = int(row["offset"].strip("`"), 0), int(row["size"].strip("`"))
    except ValueError:
        return [f"{where}: offset {row['offset']!r} / size {row['size']!r} are not numbers"]
    out = []
    for path, expr in refs:
        try:
            got_offset, got_size, dtype = resolve(path, expr)
        except Exception as e:          # a reference that does not resolve is a wrong row
            out.append(f"{where}: `{path}: {expr}` does not resolve: {e!r}")
            continue
        if (got_offset, got_size) != (offset, size):
            out.append(f"{where}: doc says offset {offset} size {size}, `{path}: {expr}` "
                       f"gives offset {got_offset} size {got_size}")
        if dtype is not None and parse_type(row["type"]) != dtype:
            out.append(f"{where}: type {row['type']!r}, `{path}: {expr}` is {dtype}")
    return out


# ---------------------------------------------------------------------------------- the tables
def test_every_row_agrees_with_the_code():
    rows = doc_rows()
    assert len(rows) > 100, f"only {len(rows)} checked rows: is the table parser broken?"
    problems = [p for row in rows for p in row_problems(row)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("column,cell", [("offset", "0x010004"), ("size", "95"),
                                         ("type", "u64"), ("code", "SEMAPHORES")])
def test_a_wrong_cell_is_caught(column, cell):
    """The check can fail: one altered cell of a real row is reported."""
    row = next(r for r in doc_rows() if "SEMAPHORE_SLOT.final_zero`" in r["code"])
    assert row_problems(row) == []
    assert row_problems({**row, column: cell})


def _references() -> list[tuple[str, str]]:
    return [ref for row in doc_rows() for ref in REF.findall(row["code"])]


def test_every_record_field_is_documented():
    named = set(_references())
    records = [("staging/records.py", name, obj) for name, obj in vars(R).items()
               if isinstance(obj, R.Record)]
    records.append(("staging/tokens.py", "HEADER_DTYPE", tk.HEADER_DTYPE))
    assert {id(r) for r in R.ALL} <= {id(obj) for _, _, obj in records}
    missing = [f"{path}: {name}.{field}" for path, name, obj in records
               for field in _dtype_of(obj).names if (path, f"{name}.{field}") not in named]
    assert not missing, "fields without a FORMATS.md row: " + ", ".join(missing)


def test_every_staging_view_and_section_is_documented():
    exprs = {expr for _, expr in _references()}
    raw = SV.allocate_host()
    names = [k for k, v in vars(SV.StagingViews(raw, profiles.COPPELIUS)).items()
             if isinstance(v, np.ndarray) and k != "raw"]
    missing = [f"StagingViews.{n}" for n in names if f"StagingViews.{n}" not in exprs]
    for p, s, i in (("COPPELIUS", 10000, 10002), ("TINY", 8, 10)):
        missing += [f"{p} {n}" for n in RS.NAMES
                    if f'section_offsets({p}, {s}, {i})["{n}"]' not in exprs]
    assert not missing, "no FORMATS.md row for: " + ", ".join(missing)


def test_every_layout_and_header_constant_is_named():
    text = FORMATS.read_text(encoding="utf-8")
    names = [n for n, v in vars(L).items() if n.isupper() and isinstance(v, int)]
    names += [n for n, v in vars(CF).items() if n.isupper() and isinstance(v, int)]
    missing = [n for n in names if not re.search(rf"\b{n}\b", text)]
    assert not missing, "constants FORMATS.md never names: " + ", ".join(missing)


# ------------------------------------------------------------------------ checkpoint header bytes
def _header_rows() -> list[dict]:
    return [r for r in doc_rows() if r["code"].startswith("`host/checkpoints/format.py:")
            and int(r["offset"], 0) + int(r["size"]) <= CF.HEADER_BYTES and r["field"] != "header"]


def _expected_header_bytes(h: CF.Header, encoded: bytes, table_end: int) -> dict:
    block = CF.identity_block(h.identities)
    digests = b"".join(h.digests)
    return {"magic": CF.MAGIC, "reserved": bytes(CF.IDENTITY_BLOCK - CF.FIXED_END),
            "identity block": block + bytes(CF.IDENTITY_CAPACITY - len(block)),
            "identities (coppelius)": block,
            "digest table": digests + bytes(CF.HEADER_DIGEST - table_end),
            "chunk digests (coppelius)": digests,
            "header digest": hashlib.sha256(encoded[:CF.HEADER_DIGEST]).digest()}


def test_header_rows_read_back_from_an_encoded_header():
    """Each documented header field, read at its documented offset and type, is what encode()
    wrote: update_count past 2**32 and digests that differ per chunk, so a slip shows."""
    prof = profiles.COPPELIUS
    digests = [hashlib.sha256(bytes([k % 256, k // 256])).digest() for k in range(prof.chunk_count)]
    h = CF.Header.for_profile(prof, 0x0123_4567_89AB, digests)
    encoded = h.encode()
    table_end = CF.DIGEST_TABLE + CF.DIGEST_BYTES * prof.chunk_count
    scalars = {"version": CF.VERSION, "header_bytes": CF.HEADER_BYTES,
               **{attr: getattr(h, attr) for attr, *_ in CF._FIELDS}}
    regions = _expected_header_bytes(h, encoded, table_end)
    rows, problems = _header_rows(), []
    assert {r["field"] for r in rows} == set(scalars) | set(regions)
    for r in rows:
        o, n, field, t = int(r["offset"], 0), int(r["size"]), r["field"], parse_type(r["type"])
        if field in scalars:
            fmt = {4: "<I", 8: "<Q"}[t.itemsize]
            got = struct.unpack_from(fmt, encoded, o)[0]
            ok = t.itemsize == n and got == scalars[field]
        else:
            got = encoded[o:o + n]
            ok = got == regions[field]
        if not ok:
            problems.append(f"FORMATS.md:{r['line']} {field}: read {got!r:.60} at {o}")
    assert not problems, "\n".join(problems)
    assert CF.Header.decode(encoded).update_count == 0x0123_4567_89AB


# ---------------------------------------------------------------------------- the size formula
def formula(text: str) -> tuple[int, int, int, int]:
    m = re.search(r"<!-- size-formula -->\s*size = (\d+)·V \+ (\d+) \+ (\d+)·s \+ (\d+)·i", text)
    assert m, "FORMATS.md lost its size formula line"
    return tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_the_size_formula_is_the_section_table(name):
    per_v, fixed, per_step, per_issue = formula(FORMATS.read_text(encoding="utf-8"))
    prof = profiles.get(name)
    for s, i in ((0, 0), (0, 1), (1, 2), (3, 1), (prof.steps, prof.steps + 2), (4097, 65)):
        want = RS.result_file_bytes(prof, s, i)
        assert per_v * prof.vocab + fixed + per_step * s + per_issue * i == want, (s, i)
    completed = RS.result_file_bytes(prof, prof.steps, prof.steps + 2)
    assert completed == {"coppelius": 41_813_600, "tiny": 58_464}[name]
    assert f"{41_813_600:,}" in FORMATS.read_text(encoding="utf-8")


# ------------------------------------------------------------------------- the worked example
def _block(text: str, kind: str, name: str) -> str:
    m = re.search(rf"<!-- {kind}: {name} -->\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"FORMATS.md has no {kind} block {name!r}"
    return m[1]


@pytest.mark.skipif(not GOLDEN.exists(), reason="no golden: run python -m tools.make_golden")
def test_the_numpy_reader_prints_what_the_doc_shows():
    text = FORMATS.read_text(encoding="utf-8")
    r = subprocess.run([sys.executable, "-c", _block(text, "example", "numpy-reader")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == _block(text, "example-output", "numpy-reader")


@pytest.mark.skipif(not GOLDEN.exists(), reason="no golden: run python -m tools.make_golden")
def test_inspect_prints_what_the_doc_shows():
    text = FORMATS.read_text(encoding="utf-8")
    inspect = subprocess.run([sys.executable, "-m", "coppelius.cli", "inspect",
                              str(GOLDEN.relative_to(ROOT)), "--json"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert inspect.returncode == 0, inspect.stderr[-2000:]
    trim = subprocess.run([sys.executable, "-c", _block(text, "example", "inspect-trim")],
                          input=inspect.stdout, capture_output=True, text=True, timeout=60)
    assert trim.returncode == 0, trim.stderr[-2000:]
    assert trim.stdout == _block(text, "example-output", "inspect-trim")


# --------------------------------------------------------------------------- CONTRACT sections
def contract_headings(text: str) -> dict[int, str]:
    found = re.findall(rf"^## {SECTION_SIGN}(\d+) (.+)$", text, re.M)
    numbers = [int(n) for n, _ in found]
    assert len(numbers) == len(set(numbers)), f"a section number repeats: {numbers}"
    return {int(n): title.strip() for n, title in found}


def test_contract_keeps_the_section_numbering():
    headings = contract_headings(CONTRACT.read_text(encoding="utf-8"))
    assert headings == CONTRACT_SECTIONS
    assert list(headings) == sorted(headings)


def cited_sections(text: str) -> set[int]:
    """Section numbers a text cites as SPEC or CONTRACT §N (ranges §7–§9 and lists , §11)."""
    out: set[int] = set()
    for m in CITATION.finditer(text):
        numbers, last = [int(m[1])], int(m[1])
        for sep, n in re.findall(r"([\u2013-]|,|and)\s*\u00a7(\d+)", m[2]):
            n = int(n)
            numbers += list(range(last + 1, n + 1)) if sep in "\u2013-" else [n]
            last = n
        out.update(numbers)
    return out


def test_the_citation_reader_sees_ranges_and_lists():
    s = SECTION_SIGN
    text = (f"(SPEC {s}2 and {s}7\u2013{s}9) (CONTRACT {s}3\u2013{s}4, {s}11) SPEC {s}15 "
            f"NUMERICS {s}5 SPEC.md")
    assert cited_sections(text) == {2, 7, 8, 9, 3, 4, 11, 15}


def _scanned_files():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in TEXT_SUFFIXES and path.is_file() and "golden" not in path.parts:
                yield path
    yield ROOT / "README.md"


def test_every_cited_section_exists_in_contract():
    headings = contract_headings(CONTRACT.read_text(encoding="utf-8"))
    cited: dict[int, list[str]] = {}
    for path in _scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for n in cited_sections(text):
            cited.setdefault(n, []).append(str(path.relative_to(ROOT)))
    assert cited, "no section citations found: is the scan broken?"
    missing = {n: files for n, files in cited.items() if n not in headings}
    assert not missing, f"cited sections without a CONTRACT.md heading: {missing}"
