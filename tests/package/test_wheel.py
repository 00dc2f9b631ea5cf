"""A built wheel runs.  It adds one top-level import package, `coppelius`, to site-packages and
ships everything a run reads (the code, the committed PTX and its manifests, the tokenizers);
installed in a fresh venv beside the runtime dependencies, its console script `coppelius doctor`,
run from another directory, finds every PTX module of both profiles in the installation and
verifies its digest."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from coppelius.backends.cuda import ptx
from coppelius.plan import profiles
from tests.host.forensics.test_api import example_files, example_script
from tests.support.paths import ROOT
from tests.support.venvs import fresh_venv, pip_into, run

SOURCES = ("pyproject.toml", "README.md", "host", "plan", "staging", "kernels_ptx")  # the build's
TARGETS = ("sm_90a", "sm_80")
FOLDERS = {"coppelius": "host", "coppelius.plan": "plan", "coppelius.staging": "staging"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built offline from a copy of the sources (the build writes build/ and an
    egg-info beside them: never in the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "wheel",
                        "--no-deps", "--no-build-isolation", "--no-index", "-w", str(base / "dist"),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    found, = (base / "dist").glob("coppelius-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(python, site-packages) of a fresh venv with the wheel installed, nothing downloaded."""
    python = fresh_venv(tmp_path_factory.mktemp("venv") / "env")
    pip_into(python, "install", "--no-deps", "--no-index", str(wheel))
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
               cwd=wheel.parent).stdout.strip()
    return python, Path(site)


def test_the_wheel_adds_one_top_level_package(installed):
    _, site = installed
    info, = site.glob("coppelius-*.dist-info")
    if (info / "top_level.txt").exists():
        assert (info / "top_level.txt").read_text().split() == ["coppelius"]
    tops = sorted(p.name for p in site.iterdir()
                  if p.name not in ("dependencies.pth", info.name, "__pycache__"))
    assert tops == ["coppelius"], tops


def test_every_package_folder_is_listed_for_the_wheel():
    """pyproject.toml lists the packages by name (the folders are mapped, not found): a new
    package folder without its line would be left out of the wheel."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_the_wheel_ships_what_a_run_reads(installed):
    _, site = installed
    pkg = site / "coppelius"
    for name in ("plan/data/tokenizer.json", "plan/kernels/release.ptx", "cli/__init__.py",
                 "staging/layout.py", "backends/cuda/backend.py"):
        assert (pkg / name).is_file(), name
    def files(top):         # pip compiles kernels_ptx/__init__.py: bytecode is not shipped data
        return sorted(p.relative_to(top) for p in top.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)
    shipped, committed = files(pkg / "kernels_ptx"), files(ROOT / "kernels_ptx")
    assert shipped == committed


@pytest.mark.parametrize("profile", profiles.names())
def test_doctor_from_the_installed_wheel_finds_every_ptx_module(installed, profile, tmp_path):
    python, site = installed
    r = run(python.parent / "coppelius", "doctor", "--json", "--profile", profile, cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr        # 1: this machine has no GPU (or no bindings)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    for target in TARGETS:
        check = checks[f"PTX {profile}/{target}"]
        entries = len(ptx.Manifest.load(profile, target).entries)    # the checkout's manifest
        assert check["ok"], check["value"]             # every file it names exists, digest verified
        assert check["value"].startswith(f"{entries} entries, "), check["value"]
        assert f"in {site / 'coppelius' / 'kernels_ptx' / profile / target}" in check["value"], \
            "the PTX came from the installation, not the checkout"


def test_the_api_example_runs_from_the_installed_wheel(installed, tmp_path):
    """docs/API.md's example as `python -c "import coppelius …"` in the fresh venv, elsewhere."""
    python, site = installed
    script = example_script(example_files(tmp_path))
    assert "from coppelius import forensics" in script
    r = run(python, "-c", script + "\nimport coppelius.forensics as F\nprint('from', F.__file__)",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "first divergent launch #" in r.stdout
    assert f"from {site / 'coppelius' / 'forensics' / '__init__.py'}" in r.stdout
