"""Real text on the tiny profile, from a checkout with nothing installed (`python3 -m
tools.checkout`): `coppelius tokenize --profile tiny` encodes files of Python's standard library
with the shipped 512-id tokenizer, and a one-step tiny run on the interpret backend trains on that
cache (one interpret step: about 13 s on an idle 2-core machine, a minute when it is shared)."""
from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.staging import tokens as tk

from tests.support.paths import ROOT
from tests.support.venvs import fresh_venv, run

TINY = profiles.get("tiny")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = [STDLIB / "json", STDLIB / "textwrap.py"]        # 68 kB: 32 contexts of the tiny 1024
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    """A fresh venv: the dependencies reachable, `coppelius` not installed (the shim mounts it)."""
    return fresh_venv(tmp_path_factory.mktemp("bare") / "env")


def checkout(python, *args) -> subprocess.CompletedProcess:
    return run(python, "-m", "tools.checkout", *map(str, args), cwd=ROOT, timeout=RUN_TIMEOUT_S)


def test_tokenize_tiny_on_the_stdlib_then_a_tiny_interpret_step(python, tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("triton")
    cache = tmp_path / "stdlib.tokens"
    r = checkout(python, "tokenize", "--profile", "tiny", *SOURCES, "-o", cache)
    assert r.returncode == 0, r.stderr
    opened = tk.TokenCache.open(cache, TINY)
    ids = np.fromfile(cache, "<u4", offset=tk.HEADER_BYTES)
    assert opened.token_count == ids.size > TINY.context + 1
    assert int(ids.max()) < TINY.vocab and int(ids.min()) == 0      # <|endoftext|> per file
    opened.validate_run(0, 1)
    r = checkout(python, "run", "--profile", "tiny", "--backend", "interpret", "--steps", "1",
                 "--quiet", "--tokens", cache, "--directory", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert "completed: 1/1 step, update count 1, 1 publication" in r.stderr, r.stderr
    from coppelius.results.reader import read
    rf = read(tmp_path / "run" / "tiny-result-c0.bin")
    assert rf.outcome == "completed" and rf.steps == 1
    assert np.isfinite(rf.step_losses()).all()
    # no embedded stream was generated for a run on --tokens
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "tiny-result-c0.bin", "tiny.ckpt", "tiny.ckpt.lock"]
