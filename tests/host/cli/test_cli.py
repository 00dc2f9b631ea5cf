"""The command line frame: --help, --version, the user-error convention (one line, exit 2)."""
import subprocess
import sys

import pytest

from coppelius import __version__
from tests.support.paths import ROOT


def coppelius(*args):
    return subprocess.run([sys.executable, "-m", "coppelius.cli", *args], capture_output=True, text=True)


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


def _demo_recipe() -> str:
    """The Makefile's `demo` recipe (its lines up to the next blank line)."""
    text = (ROOT / "Makefile").read_text()
    return text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]


def test_no_gpu_refusal_names_make_demo(tmp_path):
    """The refusal a machine without a GPU gives `make run` names a command that works
    from that state, and `make demo` is that command: the interpret backend, the plot, verify."""
    from coppelius.driver import calls as drv
    from coppelius.driver.device import Device
    from coppelius.errors import BackendUnavailable
    try:
        Device()
        pytest.skip("a GPU is present: `coppelius run` would not refuse")
    except BackendUnavailable:
        pass
    r = coppelius("run", "--profile", "tiny", "--directory", str(tmp_path), "--steps", "1")
    assert r.returncode == 2, r.stderr
    line, = r.stderr.strip().splitlines()
    assert "make demo" in line and "--profile tiny --backend interpret" in line, line
    recipe = _demo_recipe()
    for needle in ("$(VENV)/.demo", "run --profile tiny --backend interpret", "inspect",
                   "--plot", "verify"):
        assert needle in recipe, needle
    assert not list(tmp_path.glob("*.bin")), "a refused run leaves no result file"


def test_a_report_written_to_a_pipe_is_not_wrapped_at_80_columns(monkeypatch):
    """A forensic report sent to a file keeps each line of text whole (a grep finds it) and its
    tables at least WIDTH_PIPED wide; a terminal keeps its own width."""
    import io

    from coppelius.cli.console import WIDTH_PIPED, report_console
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    c = report_console(file=out)
    line = "sections: " + " · ".join(f"section {i} {i * 1000:,}" for i in range(20))
    c.print(line)
    assert out.getvalue() == line + "\n" and len(line) > WIDTH_PIPED > 80
    assert c.width >= WIDTH_PIPED
    tty = report_console(file=io.StringIO(), force_terminal=True, width=100)
    assert tty.width == 100 and not tty.soft_wrap
