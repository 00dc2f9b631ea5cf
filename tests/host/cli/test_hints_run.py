"""Every hint a first-hour refusal prints is run as printed, from a checkout (the editable
install `make demo` and `make test` leave; tests/package/test_first_hour_wheel.py does the same
from an installed wheel), and must work: the command it names succeeds, and the refused command
then gets past that refusal.  `SOURCE...` (the user's text) is the one word a hint leaves to fill.

- a missing, zeroed, text, wrongly-sized-vocabulary or stale token cache: the `coppelius tokenize
  --profile tiny …` the hint names makes the cache the tiny run needs;
- a missing optional dependency (`tokenizers`, `transformers`/`safetensors`, torch and Triton for
  `eval --backend interpret`, matplotlib): the pip command, typed in a shell outside the venv (no
  `.venv/bin` on PATH, no package index) — it names this Python and the packages themselves;
- no GPU: `make demo` (dry run) and the pip command;
- `diff`'s next step: both runs again from a checkpoint each, then `bisect`, which must compare
  them (on the fake driver), never refuse the pair;
- the README's `checkpoint show C --profile tiny`.

A run that gets past its checks reaches `make_backend`, which raises `Reached` here: no training."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coppelius import checkpoints as ckpt
from coppelius import cli
from coppelius.driver import calls as drv
from coppelius.backends.cuda import ptx
from coppelius.plan import profiles
from coppelius.staging import tokens as tk

from tests.support.fake_driver_fixture import install_for_runs
from tests.support.first_hour import clean_env, hint_of, refusal
from tests.support.paths import ROOT

TINY = profiles.get("tiny")
SHELL_PATH = "/usr/bin:/bin"        # a shell outside the venv
PIP_TIMEOUT_S = 300


class Reached(Exception):
    """The run passed every check and opened a backend."""


@pytest.fixture
def no_backend(monkeypatch):
    from coppelius.run import loop

    def reached(*args, **kwargs):
        raise Reached()
    monkeypatch.setattr(loop, "make_backend", reached)




def coppelius_command(hint: str) -> list[str]:
    """The `coppelius …` command a hint names (up to a comma or the end), as argv."""
    m = re.search(r"(coppelius [a-z-]+ [^,`]*?)(?:, or |,|`|$)", hint)
    assert m, hint
    return shlex.split(m.group(1))[1:]


def run_as_printed(capsys, hint: str, source: Path) -> None:
    argv = [str(source) if w == "SOURCE..." else w for w in coppelius_command(hint)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The user's text: a module of the standard library (about 40 kB: 20 tiny contexts)."""
    d = tmp_path_factory.mktemp("text")
    shutil.copy(Path(shutil.__file__), d / "shutil.py")
    return d / "shutil.py"


def run_argv(tmp_path, tokens, *extra) -> list:
    return ["run", "--profile", "tiny", "--backend", "interpret", "--tokens", tokens,
            "--steps", "1", "--quiet", "--directory", tmp_path / "run", *extra]


# -------------------------------------------------------------------------- token caches

def _planted(kind: str, path: Path, source: Path) -> list:
    """A cache of one kind at `path`; returns extra run arguments."""
    if kind == "zeroed":
        path.write_bytes(bytes(16 + 4 * (4 * TINY.context + 1)))
    elif kind == "text":
        path.write_bytes(source.read_bytes()[:16 + 4 * (4 * TINY.context)])
    elif kind == "another vocabulary":
        ids = np.full(4 * TINY.context + 1, TINY.vocab + 7, "<u4")
        path.write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    elif kind == "stale":
        ids = np.zeros(4 * TINY.context + 1, "<u4")
        path.write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
        return ["--source", source]
    return []


@pytest.mark.parametrize("kind", ["missing", "zeroed", "text", "another vocabulary", "stale"])
def test_a_token_cache_hint_makes_the_cache_the_run_needs(tmp_path, capsys, no_backend, source,
                                                          kind):
    pytest.importorskip("tokenizers")
    cache = tmp_path / "my.tokens"
    extra = _planted(kind, cache, source)
    line = refusal(capsys, run_argv(tmp_path, cache, *extra))
    hint = hint_of(line)
    assert "--profile tiny" in hint, hint
    run_as_printed(capsys, hint, source)
    made = Path(coppelius_command(hint)[coppelius_command(hint).index("-o") + 1])
    with pytest.raises(Reached):                        # the refused run, now past its checks
        cli.main([str(a) for a in run_argv(tmp_path, made, *extra)])
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------- optional dependencies

def run_in_a_shell(command: str) -> subprocess.CompletedProcess:
    """`command` typed in a shell outside the venv, with no package index reachable."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd="/",
                          env=clean_env(PATH=SHELL_PATH), timeout=PIP_TIMEOUT_S)


def missing(monkeypatch, *modules) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)        # import raises ImportError


def _install_hints(monkeypatch, capsys, tmp_path, source) -> dict[str, str]:
    """extra → the hint the refusal for its missing packages prints."""
    hints = {}
    with monkeypatch.context() as m:
        missing(m, "tokenizers")
        hints["text"] = hint_of(refusal(capsys, ["tokenize", "--profile", "tiny", source, "-o",
                                                 tmp_path / "t.tokens"]))
    P = np.zeros(TINY.parameter_count, np.float32)
    ckpt.publish(tmp_path / "c.ckpt", TINY, P, P, P, update_count=1)
    with monkeypatch.context() as m:
        missing(m, "safetensors")
        hints["hf"] = hint_of(refusal(capsys, ["export", tmp_path / "c.ckpt", tmp_path / "hf"]))
    ids = np.zeros(3 * TINY.context + 1, "<u4")
    (tmp_path / "e.tokens").write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    with monkeypatch.context() as m:
        missing(m, "coppelius.backends.interpret")
        hints["demo"] = hint_of(refusal(capsys, ["eval", tmp_path / "c.ckpt", "--tokens",
                                                 tmp_path / "e.tokens", "--contexts", "1",
                                                 "--backend", "interpret"]))
    return hints


def test_an_install_hint_runs_as_printed_outside_the_venv(tmp_path, capsys, monkeypatch,
                                                          source):
    """The hint names this interpreter's pip and the extra's packages; typed in a shell where
    `pip` and `python` are another Python's, and no index is reachable, it still succeeds
    (every package is here already: pip says so and exits 0).  The old hint, `pip install
    'coppelius[text]'`, fails there."""
    for module in ("tokenizers", "safetensors", "transformers", "triton", "torch"):
        pytest.importorskip(module)
    hints = _install_hints(monkeypatch, capsys, tmp_path, source)
    python = shlex.quote(sys.executable)
    for extra, hint in hints.items():
        assert hint.startswith(f"{python} -m pip install "), (extra, hint)
        assert "coppelius[" not in hint and "-e" not in shlex.split(hint), hint
        r = run_in_a_shell(hint)
        assert r.returncode == 0, (extra, hint, r.stdout[-2000:], r.stderr[-2000:])
    assert "tokenizers==" in hints["text"] and "safetensors" in hints["hf"]
    assert "torch==" in hints["demo"] and "triton==" in hints["demo"]
    old = run_in_a_shell("pip install 'coppelius[text]'")
    assert old.returncode != 0, "the old hint would have worked here: this test proves nothing"


def test_the_no_gpu_hint_names_a_make_target_and_a_pip_command_that_work():
    assert drv.from_checkout()
    hint = drv.NO_GPU_HINT
    target = re.search(r"`make (\w+)` in (\S+) ", hint)
    assert target and Path(target.group(2)) == ROOT, hint
    r = subprocess.run(["make", "-n", target.group(1)], cwd=target.group(2), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "coppelius run --profile tiny --backend interpret" in r.stdout
    pip = re.search(r": (\S+ -m pip install .*?), then ", hint).group(1)
    assert run_in_a_shell(pip).returncode == 0, pip
    assert "`coppelius run --profile tiny --backend interpret`" in hint


# --------------------------------------------------------------------------- the commands

def test_the_readmes_checkpoint_show_with_profile_parses_and_runs(tmp_path, capsys):
    readme = (ROOT / "README.md").read_text()
    assert "`coppelius checkpoint show\\|verify C [--profile P]`" in readme
    P = np.zeros(TINY.parameter_count, np.float32)
    ckpt.publish(tmp_path / "c.ckpt", TINY, P, P, P, update_count=1)
    for action in ("show", "verify"):
        assert cli.main(["checkpoint", action, str(tmp_path / "c.ckpt"), "--profile",
                         "tiny"]) == 0
    capsys.readouterr()
    line = refusal(capsys, ["checkpoint", "show", tmp_path / "c.ckpt", "--profile",
                            "coppelius"])
    assert "a 'tiny' checkpoint" in line and hint_of(line).startswith("pass --profile tiny")


@pytest.mark.skipif(not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(),
                    reason="kernels_ptx not built")
def test_diffs_next_step_runs_as_printed_and_bisect_compares(tmp_path, capsys, monkeypatch):
    """Two runs of one invocation whose result files differ at step 1 (one loss bit flipped
    after the fact): the commands diff prints — a fresh checkpoint each, both runs with
    --digests, bisect — run as printed on the fake driver, and bisect compares the pair
    (exit 0 or 1), never refuses it (exit 2: `c0 0 vs 1` when both sides shared one file)."""
    install_for_runs(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for side in ("x", "y"):
        (tmp_path / f"{side}.ckpt").write_bytes(b"")
        assert cli.main(["run", "--profile", "tiny", "--backend", "cuda", "--steps", "2",
                         "--quiet", "--checkpoint", f"{side}.ckpt", "--result",
                         f"{side}.bin"]) == 0
    from coppelius.results.reader import read
    rf = read("y.bin")
    data = bytearray(Path("y.bin").read_bytes())
    data[rf.offsets["steps"][0] + 4096 + 8] ^= 1                # step 1, row 2
    Path("y.bin").write_bytes(bytes(data))
    capsys.readouterr()
    assert cli.main(["diff", "x.bin", "y.bin"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    commands = re.findall(r"`([^`]+)`", last)
    assert commands[0] == ": > A.ckpt; : > B.ckpt", last
    assert subprocess.run(["bash", "-c", commands[0]], cwd=tmp_path).returncode == 0
    runs = [c for c in commands if c.startswith("coppelius run ")]
    assert len(runs) == 2 and "--steps 1" in runs[0] and "--digest-step 0" in runs[0], last
    for cmd in runs:
        assert cli.main(shlex.split(cmd)[1:] + ["--quiet"]) == 0, capsys.readouterr().err
    bisect = shlex.split(commands[-1])
    assert bisect[:2] == ["coppelius", "bisect"]
    capsys.readouterr()
    rc = cli.main(bisect[1:])
    assert rc in (0, 1), capsys.readouterr()
    docs = [json.loads(Path(f"{s}.json").read_text()) for s in "AB"]
    assert docs[0]["c0"] == docs[1]["c0"] == 0
