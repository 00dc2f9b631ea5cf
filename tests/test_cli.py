"""The command line frame: --help, --version, the user-error convention (one line, exit 2)."""
import subprocess
import sys

from host import __version__


def coppelius(*args):
    return subprocess.run([sys.executable, "-m", "host.cli", *args], capture_output=True, text=True)


def test_version():
    r = coppelius("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"coppelius {__version__}"


def test_help_lists_subcommands():
    r = coppelius("--help")
    assert r.returncode == 0
    assert "profiles" in r.stdout


def test_user_error_is_one_line_exit_2():
    r = coppelius("profiles", "--profile", "huge")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unknown profile 'huge'" in lines[0] and "hint:" in lines[0]
    assert "Traceback" not in r.stderr


def test_profiles_table():
    r = coppelius("profiles", "--profile", "tiny")
    assert r.returncode == 0
    assert "layers.1.wdown" in r.stdout


def test_unknown_subcommand_exits_2():
    r = coppelius("frobnicate")
    assert r.returncode == 2
