"""The first hour from an installed wheel (a fresh venv, no package index, run from another
directory): the hints the refusals print name only what exists there — no `pip install -e .`, no
`make`, no `python -m tools` — and each runs as printed there (a token cache's `coppelius
tokenize --profile tiny …`, an optional dependency's pip command typed in a shell outside the
venv); a refused run leaves its directory as it found it; and the README's block "The tiny
profile on text of your own" runs as written with the wheel's `coppelius` (tokenize files of the
standard library with the shipped 512-id tokenizer, one interpret step on that cache, inspect,
export, sample, evaluate)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.staging import tokens as tk
from tests.package.test_wheel import installed, wheel      # noqa: F401  (the fixtures)
from tests.support.first_hour import as_typed, clean_env, readme_block, run_script
from tests.support.venvs import run

TINY = profiles.get("tiny")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = [str(STDLIB / "json"), str(STDLIB / "textwrap.py")]
RUN_TIMEOUT_S = 600
# a checkout's commands (a make target, not "make one from …"), never in a wheel's hints
CHECKOUT_ONLY = ("pip install -e", "`make ", "make demo", "make test", "python -m tools", "tools.")
TEXT_HEADING = "### The tiny profile on text of your own"
SHELL_PATH = "/usr/bin:/bin"        # a shell outside the venv
PIP_TIMEOUT_S = 300


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


def in_a_shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` typed in a shell outside the venv (no venv on PATH), no package index."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(PATH=SHELL_PATH), timeout=PIP_TIMEOUT_S)


def test_no_gpu_hint_names_what_a_wheel_has(installed, tmp_path):
    r = coppelius(installed, "run", "--profile", "tiny", "--steps", "1", "--directory",
                  tmp_path / "d", cwd=tmp_path)
    if r.returncode == 0 or "no GPU" not in r.stderr:
        pytest.skip(f"this machine's cuda backend did not refuse for want of a GPU: {r.stderr}")
    assert r.returncode == 2, r.stderr
    hint = hint_of(r.stderr)
    assert not any(s in hint for s in CHECKOUT_ONLY), hint
    python, _ = installed
    pip = re.search(r": (\S+ -m pip install .*?), then ", hint).group(1)
    assert shlex.split(pip)[0] == str(python) and "torch==" in pip, pip
    assert "demo" in extras(installed)
    assert "`coppelius run --profile tiny --backend interpret`" in hint, hint
    assert not (tmp_path / "d").exists(), "a refused run creates nothing (no stream, no checkpoint)"
    done = in_a_shell(pip, tmp_path)                    # as printed, outside the venv
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def tiny_checkpoint(where: Path) -> Path:
    from coppelius import checkpoints as ckpt
    P = np.zeros(TINY.parameter_count, np.float32)
    ckpt.publish(where, TINY, P, P, P, update_count=1)
    return where


@pytest.mark.parametrize("missing, argv, package", [
    ("tokenizers", ["tokenize", "--profile", "tiny", SOURCES[1], "-o", "x.tokens"],
     "tokenizers=="),
    ("coppelius.backends.interpret", ["eval", "c.ckpt", "--tokens", "e.tokens", "--contexts", "1",
                                      "--backend", "interpret"], "torch==")])
def test_an_install_hint_runs_as_printed_from_the_wheel(installed, tmp_path, missing, argv,
                                                        package):
    """A package missing (`tokenizers` for tokenize, torch and Triton for `eval --backend
    interpret`): the hint is the wheel venv's pip with the packages themselves — never `pip
    install 'coppelius[…]'`, which no index here can satisfy, nor `make demo` or `pip install -e
    .` — and works typed in a shell outside the venv."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("torch")
    python, _ = installed
    tiny_checkpoint(tmp_path / "c.ckpt")
    ids = np.zeros(3 * TINY.context + 1, "<u4")
    (tmp_path / "e.tokens").write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    code = (f"import sys; sys.modules[{missing!r}] = None; from coppelius.cli import main; "
            f"sys.exit(main({argv!r}))")
    r = run(python, "-c", code, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    hint = hint_of(r.stderr)
    assert shlex.split(hint)[:4] == [str(python), "-m", "pip", "install"], hint
    assert package in hint and "coppelius[" not in hint, hint
    assert not any(s in hint for s in CHECKOUT_ONLY), hint
    done = in_a_shell(hint, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_checkpoint_show_with_profile_from_the_wheel(installed, tmp_path):
    """The README's `coppelius checkpoint show|verify C [--profile P]`, in the wheel."""
    ck = tiny_checkpoint(tmp_path / "c.ckpt")
    for action in ("show", "verify"):
        r = coppelius(installed, "checkpoint", action, ck, "--profile", "tiny", cwd=tmp_path)
        assert r.returncode == 0, r.stderr


def test_diffs_next_step_is_accepted_as_printed_by_the_wheel(installed, tmp_path):
    """Two result files of one invocation that differ at step 1: the commands `diff` prints —
    a fresh checkpoint each, both runs with --digests — typed as printed, get past every check
    of the wheel's `coppelius run` (on this machine without a GPU, they stop there: the
    checkout's test runs them to the bisect on the fake driver)."""
    from tests.support.result_synth import synthesize
    syn = synthesize(TINY, seed=5)
    syn.write(tmp_path / "x.bin")
    syn.windows[1, 2] += 1
    syn.write(tmp_path / "y.bin")
    r = coppelius(installed, "diff", "x.bin", "y.bin", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    commands = re.findall(r"`([^`]+)`", last)
    assert commands[0] == ": > A.ckpt; : > B.ckpt" and commands[-1].startswith("coppelius bisect")
    assert in_a_shell(commands[0], tmp_path).returncode == 0
    for cmd in [c for c in commands if c.startswith("coppelius run ")]:
        r = coppelius(installed, *shlex.split(cmd)[1:], "--quiet", cwd=tmp_path,
                      timeout=RUN_TIMEOUT_S)
        if r.returncode != 0:
            assert r.returncode == 2 and "no GPU" in r.stderr, (cmd, r.stderr)


def test_a_token_cache_hint_runs_as_printed_from_the_wheel(installed, tmp_path):
    """A missing cache: the hint's `coppelius tokenize --profile tiny SOURCE... -o CACHE` (the
    user's files for SOURCE...) makes the cache, and the refused run gets past every check
    (here it stops where the machine has no GPU, or trains)."""
    pytest.importorskip("tokenizers")
    argv = ["run", "--profile", "tiny", "--steps", "1", "--quiet", "--tokens", "mine.tokens"]
    r = coppelius(installed, *argv, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    hint = hint_of(r.stderr)
    cmd = re.search(r"(coppelius tokenize .*)$", hint).group(1)
    assert "--profile tiny" in cmd and not any(s in hint for s in CHECKOUT_ONLY), hint
    words = shlex.split(cmd.replace("SOURCE...", " ".join(map(shlex.quote, SOURCES))))
    done = coppelius(installed, *words[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    r = coppelius(installed, *argv, cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert "token cache" not in r.stderr, r.stderr
    assert r.returncode == 0 or "no GPU" in r.stderr, r.stderr


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


def test_the_readme_text_block_runs_as_written_from_the_wheel(installed, tmp_path):
    """The README's block with the wheel's `coppelius` for `.venv/bin/coppelius` (the one
    substitution the README names) and `--steps 1` on the run, in a fresh directory."""
    for module in ("tokenizers", "triton", "transformers", "safetensors"):
        pytest.importorskip(module)
    python, _ = installed
    script = as_typed(readme_block(TEXT_HEADING), python.parent / "coppelius")
    r = run_script(script, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    ids = np.fromfile(tmp_path / "coppelius-demo" / "text.tokens", "<u4", offset=16)
    assert ids.size > TINY.context + 1 and int(ids.max()) < TINY.vocab
    assert "completed: 1/1 step, update count 1, 1 publication" in r.stderr, r.stderr[-4000:]
    assert sorted(p.name for p in (tmp_path / "coppelius-demo" / "text").iterdir()) == [
        "tiny-result-c0.bin", "tiny.ckpt"]                  # no stream, no lock file
    assert (tmp_path / "coppelius-demo" / "text-hf" / "config.json").is_file()
    assert "mean loss" in r.stdout and re.search(r"-- \d+ new tokens", r.stdout), r.stdout
