"""A report prints text it did not write as written (paths, hints, device names,
messages): rich never reads "[demo]" or "[red]x[/red]" in them as markup, nor ":x:" as an emoji.
And `coppelius doctor` without a GPU prints its hint once, in a form that works as printed."""
from __future__ import annotations

import argparse
import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from coppelius import cli
from coppelius.driver import calls as drv
from coppelius.backends.cuda import ptx
from coppelius.errors import BackendUnavailable
from coppelius.plan import profiles as P

from tests.support.result_synth import synthesize

FOREIGN = "[red]x[/red] [bold] [/] :x: [demo]"       # markup, a stray closing tag, an emoji code


def _markup_dir(tmp_path) -> Path:
    """A directory whose path holds `[red]x[/red]`, `[bold]` and `:x:` (a name holds no '/')."""
    d = tmp_path / "[red]x[" / "red][bold]:x:"
    d.mkdir(parents=True)
    assert "[red]x[/red][bold]:x:" in str(d)
    return d


def test_the_report_console_prints_lines_cells_and_titles_verbatim():
    from rich.table import Table

    from coppelius.cli.console import report_console, styled
    out = io.StringIO()
    c = report_console(file=out)
    c.print(f"line {FOREIGN}")
    t = Table(title=f"title {FOREIGN}")
    t.add_column("cell")
    t.add_row(f"cell {FOREIGN}")
    c.print(t)
    c.print(styled(("FAIL", "red"), f" styled {FOREIGN}"))
    text = out.getvalue()
    for where in ("line", "title", "cell", "styled"):
        assert f"{where} {FOREIGN}" in text, (where, text)


def _no_gpu(monkeypatch):
    """The state of a machine with cuda-bindings and no GPU, whatever this machine has."""
    def no_device(*_a, **_k):
        raise BackendUnavailable("no NVIDIA driver on this machine (DynamicLibNotFoundError)",
                                 drv.NO_GPU_HINT)
    monkeypatch.setattr(drv, "bindings_version", lambda: ".".join(map(str, drv.BINDINGS_FLOOR)))
    monkeypatch.setattr("coppelius.driver.device.Device", no_device)


def _doctor(capsys, profile="tiny") -> str:
    from coppelius.cli import doctor as cmd_doctor
    assert cmd_doctor.run(argparse.Namespace(profile=profile, json=False, device=0)) == 1
    return capsys.readouterr().out


def test_doctor_without_a_gpu_prints_the_hint_once_as_it_works(monkeypatch, capsys):
    _no_gpu(monkeypatch)
    out = _doctor(capsys)
    assert out.count("no GPU here") == 1, out
    assert drv.NO_GPU_HINT in out and "-m pip install " in out and "make demo" in out, out


def test_doctor_prints_a_ptx_path_holding_markup_verbatim(monkeypatch, capsys, tmp_path):
    root = _markup_dir(tmp_path)
    monkeypatch.setattr(ptx, "ROOT", root)
    _no_gpu(monkeypatch)
    out = _doctor(capsys)
    assert f"{root / 'tiny' / 'sm_90a' / ptx.MANIFEST} is missing" in out, out


def test_inspect_prints_a_path_holding_markup_verbatim(tmp_path, capsys):
    path = _markup_dir(tmp_path) / "[bold]tiny.res"
    synthesize(P.get("tiny")).write(path)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}  profile tiny" in out, out


def test_diff_prints_paths_holding_markup_verbatim(tmp_path, capsys):
    d = _markup_dir(tmp_path)
    syn = synthesize(P.get("tiny"))
    a, b = d / "[bold]a.res", d / "[i]b.res"
    syn.write(a)
    syn.write(b)
    assert cli.main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"A: {a} (tiny" in out and f"B: {b} (tiny" in out, out


def test_run_start_line_prints_paths_holding_markup_verbatim(tmp_path, capsys):
    from coppelius.cli.run import RichProgress
    d = _markup_dir(tmp_path)
    summary = SimpleNamespace(c0=0, steps_planned=3, checkpoint=d / "c.ckpt", result=d / "r.res")
    progress = RichProgress(quiet=True)
    progress.start(summary, None, 1)
    progress.note(f"note {FOREIGN}")
    err = capsys.readouterr().err
    assert f"checkpoint {d / 'c.ckpt'}, result {d / 'r.res'}" in err, err
    assert f"note {FOREIGN}" in err, err


def test_tokenize_prints_its_output_path_verbatim(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello\n")
    out = _markup_dir(tmp_path) / "t:x:.tokens"
    assert cli.main(["tokenize", str(src), "-o", str(out)]) == 0
    assert f"{out}: 1 file(s)" in capsys.readouterr().err
