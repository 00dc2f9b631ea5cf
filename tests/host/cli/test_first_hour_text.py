"""The README's first hour on text of your own, from a checkout: its code block ("The tiny profile
on text of your own") read from the README and run as written in a fresh directory with the
checkout's `.venv/bin/coppelius` (the editable install `make demo` and `make test` leave) —
tokenize files of Python's standard library with the shipped 512-id tokenizer, train the tiny
profile on the interpret backend, inspect, export, sample, evaluate — but for `--steps 1` on the
run (one interpret step: about 20 s on an idle 2-core machine, a minute when it is shared)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.staging import tokens as tk

from tests.support.first_hour import as_typed, readme_block, run_script

TINY = profiles.get("tiny")
HEADING = "### The tiny profile on text of your own"


def test_the_readme_text_block_runs_as_written_from_a_checkout(tmp_path):
    for module in ("tokenizers", "triton", "transformers", "safetensors"):
        pytest.importorskip(module)
    coppelius = Path(sys.executable).parent / "coppelius"
    if not coppelius.is_file():
        pytest.skip(f"no {coppelius}: the suite runs outside the checkout's venv")
    r = run_script(as_typed(readme_block(HEADING), coppelius), tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    out = r.stdout
    cache = tmp_path / "coppelius-demo" / "text.tokens"
    opened = tk.TokenCache.open(cache, TINY)
    ids = np.fromfile(cache, "<u4", offset=tk.HEADER_BYTES)
    assert opened.token_count == ids.size > TINY.context + 1
    assert int(ids.max()) < TINY.vocab and int(ids.min()) == 0      # <|endoftext|> per file
    assert "completed: 1/1 step, update count 1, 1 publication" in r.stderr, r.stderr[-4000:]
    run_dir = tmp_path / "coppelius-demo" / "text"
    # no embedded stream for a run on --tokens, and no lock file after it
    assert sorted(p.name for p in run_dir.iterdir()) == ["tiny-result-c0.bin", "tiny.ckpt"]
    assert (tmp_path / "coppelius-demo" / "text-hf" / "model.safetensors").is_file()
    assert "outcome completed" in out and re.search(r"-- \d+ new tokens", out), out
    assert "mean loss" in out and "contexts 1..8" in out, out
