"""The README's first-hour commands, read from the README itself and run as a user types them:
a code block under a heading, one shell script, with the only substitutions the tests name
(where `coppelius` is, and `--steps 1` for a run so that the suite stays short)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from tests.support.paths import ROOT

README = ROOT / "README.md"
VENV_COPPELIUS = ".venv/bin/coppelius"      # how the README names the checkout's command
ONE_STEP = "--steps 1"
BLOCK_TIMEOUT_S = 900


def readme_block(heading: str) -> str:
    """The first fenced code block after the line `heading` in the README."""
    text = README.read_text()
    at = text.index(f"\n{heading}\n")
    m = re.search(r"\n```\n(.*?)\n```\n", text[at:], re.S)
    assert m, f"no code block under {heading!r}"
    return m.group(1)


def as_typed(block: str, coppelius: Path, steps_one: bool = True) -> str:
    """The block with `.venv/bin/coppelius` spelt `coppelius` (an absolute path: the test's
    setting) and, for the suite's time, every `coppelius run` limited to one step."""
    if steps_one:
        block = block.replace(f"{VENV_COPPELIUS} run ", f"{VENV_COPPELIUS} run {ONE_STEP} ")
    return block.replace(VENV_COPPELIUS, shlex.quote(str(coppelius)))


def clean_env(**extra) -> dict:
    """The environment a user's shell has: no PYTHONPATH, no package index, the model hub
    offline (an export loads from its directory)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_NO_INDEX="1", PIP_INDEX_URL="http://127.0.0.1:9/", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", **extra)
    return env


def run_script(script: str, cwd: Path, timeout: float = BLOCK_TIMEOUT_S,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """`bash -e -x` over the script (each command echoed to stderr before it runs)."""
    return subprocess.run(["bash", "-e", "-x", "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env())


def refusal(capsys, argv) -> str:
    """The one line of a refused command run in-process (exit 2, no traceback)."""
    from coppelius import cli
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def hint_of(line: str) -> str:
    """The hint of a refusal's line: what follows "(hint: " up to its closing parenthesis."""
    m = re.search(r"\(hint: (.*)\)$", line)
    assert m, line
    return m.group(1)
