"""The first hour from an installed wheel (a fresh venv, no package index, run from another
directory): the hints the refusals print name only what exists there — no `pip install -e .`, no
`make`, no `python -m tools` — a refused run leaves its directory as it found it, the hint for a
tokenizer with too many ids runs as printed, and the tiny profile trains on real text:
`coppelius tokenize --profile tiny` on files of the standard library (the shipped 512-id
tokenizer), then one interpret step on that cache."""
from __future__ import annotations

import json
import re
import shlex
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from coppelius.plan import profiles
from tests.package.test_wheel import installed, wheel      # noqa: F401  (the fixtures)
from tests.support.venvs import run

TINY = profiles.get("tiny")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = [str(STDLIB / "json"), str(STDLIB / "textwrap.py")]
RUN_TIMEOUT_S = 600
CHECKOUT_ONLY = ("pip install -e", "make ", "python -m tools", "tools.")


def coppelius(installed, *args, cwd: Path, timeout: float = 120):
    python, _ = installed
    return run(python.parent / "coppelius", *map(str, args), cwd=cwd, timeout=timeout)


def hint_of(stderr: str) -> str:
    line, = stderr.strip().splitlines()
    m = re.search(r"\(hint: (.*)\)$", line)
    assert m, line
    return m.group(1)


def tree(root: Path) -> list:
    return [(str(p.relative_to(root)), p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in [root, *sorted(root.rglob("*"))]]


def extras(installed) -> list[str]:
    python, _ = installed
    r = run(python, "-c", "import importlib.metadata as m, json; "
            "print(json.dumps(m.metadata('coppelius').get_all('Provides-Extra')))", cwd=Path("/"))
    return json.loads(r.stdout)


def test_no_gpu_hint_names_what_a_wheel_has(installed, tmp_path):
    r = coppelius(installed, "run", "--profile", "tiny", "--steps", "1", "--directory",
                  tmp_path / "d", cwd=tmp_path)
    if r.returncode == 0 or "no GPU" not in r.stderr:
        pytest.skip(f"this machine's cuda backend did not refuse for want of a GPU: {r.stderr}")
    assert r.returncode == 2, r.stderr
    hint = hint_of(r.stderr)
    assert not any(s in hint for s in CHECKOUT_ONLY), hint
    assert "pip install 'coppelius[demo]'" in hint, hint
    assert "demo" in extras(installed)
    assert "`coppelius run --profile tiny --backend interpret`" in hint, hint
    assert not (tmp_path / "d").exists(), "a refused run creates nothing (no stream, no checkpoint)"


def test_doctor_hints_name_what_a_wheel_has(installed, tmp_path):
    r = coppelius(installed, "doctor", "--profile", "tiny", cwd=tmp_path)
    assert r.returncode in (0, 1, 2), r.stderr
    text = r.stdout + r.stderr
    for hint in re.findall(r"hint: (.*)", text):
        assert not any(s in hint for s in CHECKOUT_ONLY), hint
    for extra in re.findall(r"'coppelius\[(\w+)\]'", text):
        assert extra in extras(installed), extra


def test_the_too_many_ids_hint_runs_as_printed_in_a_wheel(installed, tmp_path):
    pytest.importorskip("tokenizers")
    python, site = installed
    shipped = site / "coppelius" / "plan" / "data"
    assert sorted(p.name for p in shipped.glob("*.json")) == ["tokenizer-512.json",
                                                             "tokenizer.json"]
    r = coppelius(installed, "tokenize", "--profile", "tiny", "--tokenizer",
                  shipped / "tokenizer.json", *SOURCES, "-o", tmp_path / "x.tokens", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "x.tokens").exists(), r.stderr
    hint = hint_of(r.stderr)
    assert not any(s in hint for s in CHECKOUT_ONLY), hint
    cmd = re.search(r"(coppelius tokenize --train-tokenizer \S+ --vocab \d+) SOURCE\.\.\.",
                    hint).group(1)
    before = {p.name: p.read_bytes() for p in shipped.glob("*.json")}
    r = coppelius(installed, *shlex.split(cmd)[1:], *SOURCES, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "my-tokenizer.json").is_file()
    r = coppelius(installed, "tokenize", "--profile", "tiny", "--tokenizer", "my-tokenizer.json",
                  *SOURCES, "-o", "mine.tokens", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in shipped.glob("*.json")} == before


def test_tiny_on_real_text_from_the_wheel(installed, tmp_path):
    """tokenize --profile tiny with the shipped 512-id tokenizer, then one interpret step."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("triton")
    r = coppelius(installed, "tokenize", "--profile", "tiny", *SOURCES, "-o", "text.tokens",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ids = np.fromfile(tmp_path / "text.tokens", "<u4", offset=16)
    assert ids.size > TINY.context + 1 and int(ids.max()) < TINY.vocab
    r = coppelius(installed, "run", "--profile", "tiny", "--backend", "interpret", "--steps", "1",
                  "--quiet", "--tokens", "text.tokens", cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert "completed: 1/1 step, update count 1, 1 publication" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "coppelius-run").iterdir()) == [
        "tiny-result-c0.bin", "tiny.ckpt", "tiny.ckpt.lock"]
