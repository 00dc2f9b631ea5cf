"""The first hour on a fresh clone: a refused command leaves its directory as it found it (one test
per refusal class, the tree compared before and after), every hint those refusals print names
commands that exist in a checkout, and the smaller defects a new user meets (plurals, the
finished bar, `inspect | head`, nlink 0, one host-gap percentile, verify's stream).

The runs use the cuda backend's host logic on the fake driver (tools/fake_driver.py), or no
backend at all: a refusal comes before one opens."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from coppelius import checkpoints
from coppelius import cli
from coppelius.driver import calls as drv
from coppelius.backends.cuda import ptx
from coppelius.plan import profiles
from coppelius.staging import synthetic

from tests.support.fake_driver_fixture import install_for_runs
from tests.support.paths import GOLDEN, ROOT

TINY = profiles.get("tiny")
GOLDEN_RESULT = GOLDEN / "tiny-result-c0.bin"

needs_ptx = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


@pytest.fixture
def fake(monkeypatch):
    """The fake driver under the cuda backend; its records pass the marker check."""
    return install_for_runs(monkeypatch)


def tree(root: Path) -> dict:
    """Every entry under `root` (itself included): kind, size of files, mtime (a file created and
    removed again changes its directory's mtime)."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode),
                                         st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                         st.st_mtime_ns)
    return out


def refused(capsys, argv, root: Path) -> str:
    """Run `coppelius ARGV`, which must refuse (exit 2, one line) and leave `root` unchanged;
    returns the line."""
    before = tree(root)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert tree(root) == before, f"{argv} changed {root}"
    return lines[0]


def hint_of(line: str) -> str:
    m = re.search(r"\(hint: (.*)\)$", line)
    assert m, line
    return m.group(1)


def default_run(d: Path, *extra) -> list[str]:
    return ["run", "--profile", "tiny", "--quiet", "--directory", str(d / "coppelius-run"),
            *extra]


# ------------------------------------------------------------- a refusal leaves nothing behind

def test_refused_arguments_leave_nothing(tmp_path, capsys):
    line = refused(capsys, default_run(tmp_path, "--steps", "0"), tmp_path)
    assert "--steps 0 is outside" in line
    line = refused(capsys, default_run(tmp_path, "--digest-step", "1"), tmp_path)
    assert "--digest-step needs --digests" in line


@pytest.mark.parametrize("kind", ["file", "fifo", "device"])
def test_a_directory_that_is_a_file_fifo_or_device_is_enotdir(tmp_path, capsys, kind):
    where = tmp_path / "not-a-dir"
    if kind == "file":
        where.write_text("x")
    elif kind == "fifo":
        os.mkfifo(where)
    else:
        where = Path(os.devnull)
    before = tree(tmp_path)
    assert cli.main(["run", "--profile", "tiny", "--quiet", "--directory", str(where)]) == 2
    line = capsys.readouterr().err.strip()
    assert f"directory {where}: cannot create: Not a directory (ENOTDIR)" in line, line
    assert "File exists" not in line
    assert tree(tmp_path) == before


def test_a_locked_checkpoint_is_refused_before_anything_is_created(tmp_path, capsys):
    d = tmp_path / "coppelius-run"
    d.mkdir()
    (d / "tiny.ckpt").touch()
    with checkpoints.lock(d / "tiny.ckpt"):
        line = refused(capsys, default_run(tmp_path), tmp_path)
    assert "is in use by another run" in line
    assert not (d / f"tiny{synthetic.STREAM_SUFFIX}").exists()


def test_a_result_file_as_checkpoint_leaves_nothing(tmp_path, capsys):
    shutil.copy(GOLDEN_RESULT, tmp_path / "r.bin")
    line = refused(capsys, default_run(tmp_path, "--checkpoint", str(tmp_path / "r.bin")),
                   tmp_path)
    assert "checkpoint" in line and not (tmp_path / "coppelius-run").exists()


def test_a_text_file_as_token_cache_is_named_as_such(tmp_path, capsys):
    """A text file whose size fits 16 + 4k bytes reads as ids far beyond any vocabulary: the
    refusal says it is not a token cache and how to make one from it, not "re-tokenize"."""
    text = tmp_path / "notes.txt"
    body = b"def f(x):\n    return x + 1\n" * 400
    text.write_bytes(body[:16 + 4 * ((len(body) - 16) // 4)])
    line = refused(capsys, default_run(tmp_path, "--tokens", str(text), "--steps", "1"),
                   tmp_path)
    assert "not a token cache" in line and "re-tokenize" not in line, line
    hint = hint_of(line)
    cache = tmp_path / "notes.tokens"
    # the run's profile named: a cache of the default profile's ids would be refused in turn
    assert hint == f"make one from it: coppelius tokenize --profile tiny {text} -o {cache}"
    pytest.importorskip("tokenizers")
    argv = shlex.split(hint.split(": ", 1)[1])
    assert cli.main(argv[1:]) == 0 and cache.is_file()          # the hint, run as printed


def test_a_missing_driver_generates_no_stream(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(drv, "_cu", None)
    from coppelius.driver.device import Device
    from coppelius.errors import BackendUnavailable
    try:
        Device()
        pytest.skip("a GPU is present: the cuda backend would open")
    except BackendUnavailable:
        pass
    line = refused(capsys, default_run(tmp_path, "--steps", "1"), tmp_path)
    assert not (tmp_path / "coppelius-run").exists(), line


def test_a_missing_torch_generates_no_stream(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "coppelius.backends.interpret", None)    # ImportError
    line = refused(capsys, default_run(tmp_path, "--backend", "interpret", "--steps", "1"),
                   tmp_path)
    assert "needs Triton and torch" in line
    assert hint_of(line) == drv.install_hint("demo")
    assert not (tmp_path / "coppelius-run").exists()


def test_an_existing_result_or_an_altered_stream_leaves_the_directory_as_it_was(tmp_path,
                                                                                capsys):
    d = tmp_path / "coppelius-run"
    d.mkdir()
    (d / "tiny-result-c0.bin").write_bytes(b"an earlier result")
    line = refused(capsys, default_run(tmp_path), tmp_path)
    assert "exists" in line and not (d / "tiny.ckpt").exists()
    (d / "tiny-result-c0.bin").unlink()
    (d / f"tiny{synthetic.STREAM_SUFFIX}").write_bytes(b"\0" * 20)
    line = refused(capsys, default_run(tmp_path), tmp_path)
    assert "embedded stream" in line and not (d / "tiny.ckpt").exists()


@needs_ptx
def test_a_run_that_goes_ahead_creates_its_files_and_says_one_step(fake, tmp_path, capsys):
    """After the checks the embedded default creates what it needs; one step and one
    publication are said in the singular."""
    assert cli.main(default_run(tmp_path, "--backend", "cuda", "--steps", "1")) == 0
    err = capsys.readouterr().err
    d = tmp_path / "coppelius-run"
    names = sorted(p.name for p in d.iterdir())
    assert names == ["tiny-result-c0.bin", "tiny-result-c0.bin.telemetry.json",
                     f"tiny{synthetic.STREAM_SUFFIX}", "tiny.ckpt"], names   # no lock file left
    assert "c0=0, 1 step," in err, err
    assert "completed: 1/1 step, update count 1, 1 publication," in err, err


def damaged_checkpoint(path: Path) -> Path:
    """A tiny checkpoint whose header is sound and whose last payload byte is flipped."""
    import numpy as np
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    checkpoints.publish(path, TINY, P, P, P, update_count=1)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    return path


def contents(root: Path) -> dict:
    """Every entry under `root` with its kind and bytes (not the directories' mtimes)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@needs_ptx
@pytest.mark.parametrize("where", ["the default directory", "a named checkpoint"])
def test_a_damaged_checkpoint_payload_is_refused_before_anything_is_created(fake, tmp_path,
                                                                            capsys, where):
    """Every chunk digest is checked before the backend opens: nothing is created (no stream,
    no lock file, no directory, no result), not even for a moment (the mtimes hold)."""
    if where == "the default directory":
        (tmp_path / "coppelius-run").mkdir()
        damaged_checkpoint(tmp_path / "coppelius-run" / "tiny.ckpt")
        argv = default_run(tmp_path, "--backend", "cuda", "--steps", "1")
    else:
        (tmp_path / "src").mkdir()
        ck = damaged_checkpoint(tmp_path / "src" / "tiny.ckpt")
        argv = default_run(tmp_path, "--backend", "cuda", "--steps", "1", "--checkpoint", str(ck))
    line = refused(capsys, argv, tmp_path)
    assert "digest differs" in line and "payload is damaged" in line, line


@needs_ptx
def test_a_payload_damaged_while_the_backend_opens_leaves_what_was_there(fake, tmp_path, capsys,
                                                                         monkeypatch):
    """Damaged after the first pass (as the backend opened): the load's own digests refuse
    it, and what the run had created by then — its directory, the stream, the lock file, the
    result file — goes with the refusal."""
    from coppelius.run import loop
    ck = damaged_checkpoint(tmp_path / "tiny.ckpt")
    sound = bytearray(ck.read_bytes())
    sound[-1] ^= 1
    ck.write_bytes(bytes(sound))                         # sound for the first pass ...
    real = loop.make_backend

    def damaging(*args):
        backend = real(*args)
        damaged_checkpoint(ck)                           # ... damaged as the backend opens
        return backend
    monkeypatch.setattr(loop, "make_backend", damaging)
    before = contents(tmp_path)
    before["tiny.ckpt"] = damaged_checkpoint(tmp_path / "copy.ckpt").read_bytes()
    (tmp_path / "copy.ckpt").unlink()
    assert cli.main(default_run(tmp_path, "--backend", "cuda", "--steps", "1", "--checkpoint",
                                str(ck))) == 2
    err = capsys.readouterr().err
    assert "digest differs" in err and len(err.strip().splitlines()) == 1, err
    assert contents(tmp_path) == before


# ------------------------------------------------------------------------- smaller defects

def test_the_finished_bar_says_done_not_left_zero():
    from rich.progress import Progress

    from coppelius.cli.run import left_field
    with Progress(disable=True) as p:
        task_id = p.add_task("train", total=3)
        task = p.tasks[0]
        assert left_field(task).startswith("left ")
        p.update(task_id, completed=3)
        assert left_field(task) == "done"


def test_inspect_into_a_closed_pipe_exits_0_quietly():
    """`inspect … | head -1`: the reader leaves after one line; exit 0, nothing on stderr."""
    code = ("import sys\nfrom coppelius import cli\n"
            f"sys.exit(cli.main(['inspect', {str(GOLDEN_RESULT)!r}]))")
    r = subprocess.run(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} | head -c 10; "
                       "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash",
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr)


def test_inspect_explains_nlink_0(capsys):
    """The golden run started from an empty checkpoint that its publication replaced: the stat
    record, taken after the run, says nlink 0; inspect says why."""
    assert cli.main(["inspect", str(GOLDEN_RESULT)]) == 0
    out = capsys.readouterr().out
    assert "nlink 0 (the input file as opened; the run's publication replaced it" in out, out


def test_inspect_and_the_plot_show_one_host_gap_p99(capsys):
    pytest.importorskip("matplotlib")
    from coppelius.forensics.plot import figure
    from coppelius.forensics.summary import summarize
    from coppelius.results.reader import read
    rf = read(GOLDEN_RESULT)
    timing = summarize(rf)["timing"]
    titles = [ax.get_title(loc="left") for ax in figure(rf).axes]
    gap_title, = [t for t in titles if t.startswith("host gap")]
    assert f"p99 {timing['host_gap_us_p99']:,.1f} µs" in gap_title, (gap_title, timing)
    assert f"p50 {timing['host_gap_us_p50']:,.1f} µs" in gap_title, (gap_title, timing)
    assert timing["host_gaps_timed"] == rf.steps


def test_verify_without_tokens_writes_nothing_and_names_the_stream(tmp_path, capsys):
    """verify recomputes on the embedded stream without writing it into --directory; a result
    that does not match (here one loss bit flipped) is said to differ from the stream too."""
    from coppelius.results.reader import read
    rf = read(GOLDEN_RESULT)
    flipped = tmp_path / "flipped.bin"
    data = bytearray(GOLDEN_RESULT.read_bytes())
    data[rf.offsets["steps"][0] + 3] ^= 0x40
    flipped.write_bytes(bytes(data))
    before = tree(tmp_path)
    assert cli.main(["verify", str(flipped), "--steps", "1",
                     "--directory", str(tmp_path / "d")]) == 1
    out = capsys.readouterr().out
    assert "verification failed" in out and "--tokens" in out, out
    assert tree(tmp_path) == before


# ------------------------------------------------------------------- hints work as printed

def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))


def check_named_commands(hint: str) -> list[str]:
    """Every command the hint names (in backticks, or after `pip install`) exists in this
    checkout: a Makefile target, an extra of pyproject.toml, a coppelius subcommand whose
    arguments parse.  Returns the commands checked."""
    import tomllib

    from packaging.requirements import Requirement
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = re.findall(r"`([^`]+)`", hint)
    named += re.findall(r"(\S+ -m pip install (?:'[^']*'|[^\s,;`']+)(?: (?:'[^']*'|[^\s,;`']+))*)",
                        hint)
    named += re.findall(r"(coppelius [a-z]+ --[^,;`]+?)(?:,|;|$| then)", hint)
    assert named, hint
    for cmd in named:
        words = shlex.split(cmd.replace("…", "").replace("SOURCE...", "src.py"))
        if words[0] == "make":
            assert words[1] in makefile_targets(), cmd
        elif words[1:4] == ["-m", "pip", "install"]:
            # this interpreter's pip and the packages themselves, never the project by name
            assert words[0] == sys.executable, cmd
            for spec in words[4:]:
                assert not spec.startswith(("coppelius", ".", "-")), cmd
                Requirement(spec)
            assert extras, "pyproject.toml has its extras"
        elif words[0] == "coppelius":
            try:
                cli.build_parser().parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"{cmd!r} does not parse")
        else:
            pytest.fail(f"{cmd!r}: not a command this test knows")
    return named


def test_the_hints_name_commands_that_exist_in_a_checkout(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    assert drv.from_checkout()
    hints = [drv.NO_GPU_HINT, drv.install_hint("demo"), drv.BINDINGS_HINT]
    big = ["tokenize", "--profile", "tiny", "--tokenizer", str(ROOT / "plan/data/tokenizer.json"),
           str(ROOT / "README.md"), "-o", str(tmp_path / "x.tokens")]
    hints.append(hint_of(refused(capsys, big, tmp_path)))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    hints.append(hint_of(refused(capsys, ["tokenize", "--tokenizer", str(bad), str(bad), "-o",
                                          str(tmp_path / "y.tokens")], tmp_path)))
    for hint in hints:
        assert "python -m tools" not in hint, hint
        check_named_commands(hint)
    assert "make demo" in drv.NO_GPU_HINT


def test_the_train_hint_runs_as_printed_and_never_replaces_a_shipped_file(tmp_path, capsys):
    """The too-many-ids hint's command trains a 512-id tokenizer on the user's text (here two
    stdlib modules), and the tiny profile tokenizes with it; naming a shipped file is refused."""
    pytest.importorskip("tokenizers")
    from coppelius import tokenizer as tz
    hint = tz.train_hint(TINY.vocab)
    cmd = re.search(r"(coppelius tokenize --train-tokenizer \S+ --vocab \d+) SOURCE\.\.\.",
                    hint).group(1)
    sources = [str(Path(os.__file__)), str(Path(shutil.__file__))]
    out = tmp_path / "my-tokenizer.json"
    argv = shlex.split(cmd)[1:]
    argv[argv.index("my-tokenizer.json")] = str(out)
    assert cli.main(argv + sources) == 0, capsys.readouterr().err
    assert tz.vocabulary_size(tz.load(out)) == TINY.vocab
    assert cli.main(["tokenize", "--profile", "tiny", "--tokenizer", str(out), *sources,
                     "-o", str(tmp_path / "t.tokens")]) == 0
    capsys.readouterr()
    shipped = tz.DATA / "tokenizer-512.json"
    before = shipped.read_bytes()
    line = refused(capsys, ["tokenize", "--train-tokenizer", str(shipped), "--vocab", "512",
                            *sources], tmp_path)
    assert "shipped tokenizers" in line and shipped.read_bytes() == before
    assert refused(capsys, argv + sources, tmp_path).endswith("(hint: pass --force to "
                                                              "overwrite it)")


# --------------------------------------------------------------------- make run's bindings

def make_run_install_line(env: dict) -> str:
    """The pip line `make run` would run (make -n -B: printed, nothing done)."""
    r = subprocess.run(["make", "-n", "-B", "run"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    line, = [x for x in r.stdout.splitlines() if " -e ." in x]
    return line


@pytest.mark.parametrize("driver_version, spec", [(12040, "cuda-bindings>=12.9.1,<13"),
                                                  (13000, "cuda-bindings>=13.0.0,<14")])
def test_make_run_installs_the_bindings_of_the_drivers_major(tmp_path, driver_version, spec):
    """`make run` asks the driver (cuDriverGetVersion through ctypes; here the stub libcuda) for
    its CUDA major and installs cuda-bindings of that major, the spec BINDINGS_HINT names."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    from tests.support import stub_driver
    built = stub_driver.build()
    if isinstance(built, str):
        pytest.skip(built)
    env = stub_driver.env(tmp_path / "stub.log", built,
                          COPPELIUS_STUB_DRIVER_VERSION=driver_version)
    assert make_run_install_line(env).endswith(f" -e . '{spec}'")
    assert f"'{spec}'" in drv.BINDINGS_HINT


def test_make_run_without_a_driver_leaves_the_choice_to_pip():
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {**os.environ, "LD_LIBRARY_PATH": "/nonexistent", "PATH": "/usr/bin:/bin"}
    from coppelius.driver.device import Device
    from coppelius.errors import BackendUnavailable
    try:
        Device()
        pytest.skip("a GPU is present")
    except BackendUnavailable:
        pass
    assert make_run_install_line(env).endswith(" -e . ")


def test_the_training_tool_needs_an_explicit_output_and_never_replaces_one(tmp_path, capsys):
    """`python -m tools.train_tokenizer` once wrote plan/data/tokenizer.json by default: now the
    output is named, and an existing file (a shipped one included) is refused before training."""
    from tools import train_tokenizer
    with pytest.raises(SystemExit) as e:
        train_tokenizer.main([])
    assert e.value.code == 2 and "-o/--output" in capsys.readouterr().err
    shipped = ROOT / "plan" / "data" / "tokenizer.json"
    before = shipped.read_bytes()
    assert train_tokenizer.main(["-o", str(shipped)]) == 2
    assert "exists (hint: pass --force" in capsys.readouterr().err
    assert shipped.read_bytes() == before
