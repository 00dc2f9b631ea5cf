"""A built wheel runs.  The wheel ships everything a run reads (the code, kernels_ptx/,
plan/data/), and `coppelius doctor` run from the installation, with the checkout nowhere on the
path and the cwd outside it, finds every PTX module of both profiles and verifies its digest."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from host import ptx
from plan import profiles

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "host", "plan", "staging", "kernels_ptx")  # the build's
TARGETS = ("sm_90a", "sm_80")
PIP_TIMEOUT_S = 120


def _pip(*args) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                       capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built offline from a copy of the sources (the build writes build/ and an
    egg-info beside them: never in the checkout), installed with --target into its own folder."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, src / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(base / "dist"),
         str(src))
    wheel, = (base / "dist").glob("coppelius-*.whl")
    _pip("install", "--no-deps", "--no-index", "--target", str(base / "site"), str(wheel))
    return base / "site"


def _outside_checkout(entry: str) -> bool:
    """A path entry of this interpreter's that is not the checkout (its venv may lie inside)."""
    path = Path(entry).resolve()
    return path.is_dir() and (not path.is_relative_to(ROOT)
                              or path.is_relative_to(Path(sys.prefix).resolve()))


def _outside_python(site: Path, *args) -> subprocess.CompletedProcess:
    """`python -S` (no .pth file runs, so the editable install's finder that maps `host` to the
    checkout is off) with the installation first on the path, then this interpreter's entries
    outside the checkout (the dependencies), from a cwd outside the checkout."""
    deps = [p for p in sys.path if p and _outside_checkout(p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *deps])}
    env.pop("PYTHONHOME", None)
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True,
                          cwd=site.parent, env=env, timeout=60)


def test_the_wheel_ships_what_a_run_reads(installed):
    for name in ("plan/data/tokenizer.json", "plan/kernels/release.ptx", "host/cli.py",
                 "staging/layout.py"):
        assert (installed / name).is_file(), name
    shipped = sorted(p.relative_to(installed) for p in (installed / "kernels_ptx").rglob("*")
                     if p.is_file())
    committed = sorted(p.relative_to(ROOT) for p in ptx.ROOT.rglob("*") if p.is_file())
    assert shipped == committed


@pytest.mark.parametrize("profile", profiles.names())
def test_doctor_from_the_installed_wheel_finds_every_ptx_module(installed, profile):
    r = _outside_python(installed, "-m", "host.cli", "doctor", "--json", "--profile", profile)
    assert r.returncode in (0, 1), r.stderr        # 1: this machine has no GPU (or no bindings)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    for target in TARGETS:
        check = checks[f"PTX {profile}/{target}"]
        entries = len(ptx.Manifest.load(profile, target).entries)    # the checkout's manifest
        assert check["ok"], check["value"]             # every file it names exists, digest verified
        assert check["value"].startswith(f"{entries} entries, "), check["value"]
        assert f"in {installed / 'kernels_ptx' / profile / target}" in check["value"], \
            "the PTX came from the installation, not the checkout"
