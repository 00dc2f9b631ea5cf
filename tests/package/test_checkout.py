"""The checkout runs with nothing installed: `python3 -m tools.checkout COMMAND` from its root, in
a Python that has the runtime dependencies and no `coppelius` (a fresh venv, no package index).
Nothing is built or installed; the shim answers `import coppelius` from the checkout's folders
through pyproject's package-dir table, the one the wheel is built from."""
from __future__ import annotations

import json

import pytest

from coppelius.backends.cuda import ptx
from tests.support.paths import ROOT
from tests.support.venvs import fresh_venv, run


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    return fresh_venv(tmp_path_factory.mktemp("bare") / "env")


def test_without_the_shim_there_is_no_coppelius(python):
    r = run(python, "-c", "import coppelius", cwd=ROOT)
    assert r.returncode == 1 and "No module named 'coppelius'" in r.stderr, r.stderr


def test_the_shim_maps_every_folder_to_its_import_name(python):
    code = ("from tools import checkout; import coppelius, coppelius.plan.launches, "
            "coppelius.staging.layout, coppelius.kernels_ptx, coppelius.cli; "
            "print(coppelius.__file__, coppelius.plan.launches.__file__, "
            "coppelius.staging.layout.__file__, list(coppelius.kernels_ptx.__path__)[0])")
    r = run(python, "-c", code, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(ROOT / "host" / "__init__.py"),
                                str(ROOT / "plan" / "launches" / "__init__.py"),
                                str(ROOT / "staging" / "layout.py"), str(ROOT / "kernels_ptx")]


def test_doctor_runs_from_the_checkout_with_nothing_installed(python):
    r = run(python, "-m", "tools.checkout", "doctor", "--json", "--profile", "tiny", cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr        # 1: this machine has no GPU
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    for target in ("sm_90a", "sm_80"):
        check = checks[f"PTX tiny/{target}"]
        assert check["ok"], check["value"]
        entries = len(ptx.Manifest.load("tiny", target).entries)
        assert check["value"].startswith(f"{entries} entries, "), check["value"]
        assert f"in {ROOT / 'kernels_ptx' / 'tiny' / target}" in check["value"]


def test_a_command_refuses_as_the_console_script_does(python):
    r = run(python, "-m", "tools.checkout", "profiles", "--profile", "huge", cwd=ROOT)
    assert r.returncode == 2 and r.stderr.startswith("coppelius profiles: "), r.stderr
