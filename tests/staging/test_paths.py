"""Every path a command takes, refused in one line (exit 2) when it is special.

The kinds: a directory, a FIFO, /dev/zero, /dev/null, a missing path, a dangling symbolic link, a
path through a file (ENOTDIR), a symbolic-link loop (ELOOP), a 300-character name (ENAMETOOLONG).
Every command runs in-process under an alarm (a blocking open fails the test instead of blocking
CI; faulthandler ends the process if even that cannot unwind); the issue's FIFO reproducers also
run as real processes with a timeout.  Also here: the shared helper on its own, the hint on every
refusal (an AST scan), and the escaping of bytes in messages.
"""
from __future__ import annotations

import ast
import contextlib
import errno
import faulthandler
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from coppelius import checkpoints
from coppelius import cli
from coppelius.plan import profiles
from coppelius.staging import paths
from coppelius.staging import tokens as tk
from coppelius.staging.errors import UserError

from tests.support.result_synth import synthesize
from tests.support.paths import ROOT

TINY = profiles.get("tiny")
REPO = ROOT
HANG_S = 10                     # a refusal takes milliseconds; a blocking open never returns
KINDS = ("directory", "fifo", "dev_zero", "dev_null", "missing", "dangling", "enotdir", "eloop",
         "enametoolong")


class Hang(BaseException):
    """Raised by the alarm: the command blocked."""


@contextlib.contextmanager
def deadline(seconds: int = HANG_S):
    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s: the command blocks")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    # if the alarm cannot unwind it (a worker thread blocked for good), end the process loudly
    faulthandler.dump_traceback_later(seconds * 3, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def special(tmp: pathlib.Path, kind: str, output: bool = False) -> str:
    """A path of `kind` under `tmp`.  For outputs, "missing" is a missing *directory* (a missing
    file is what an output normally is)."""
    if kind == "directory":
        (tmp / "adir").mkdir(exist_ok=True)
        return str(tmp / "adir")
    if kind == "fifo":
        p = tmp / "afifo"
        if not p.exists():
            os.mkfifo(p)
        return str(p)
    if kind == "dev_zero":
        return "/dev/zero"
    if kind == "dev_null":
        return "/dev/null"
    if kind == "missing":
        return str(tmp / "nodir" / "x") if output else str(tmp / "missing")
    if kind == "dangling":
        p = tmp / "dangling"
        if not os.path.lexists(p):
            p.symlink_to(tmp / "nowhere")
        return str(p)
    if kind == "enotdir":
        (tmp / "plain").write_bytes(b"x")
        return str(tmp / "plain" / "x")
    if kind == "eloop":
        p = tmp / "loop"
        if not os.path.lexists(p):
            p.symlink_to(p)
        return str(p / "x") if output else str(p)
    if kind == "enametoolong":
        return str(tmp / ("a" * 300))
    raise ValueError(kind)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Valid files for the arguments that are not under test."""
    d = tmp_path_factory.mktemp("inputs")
    ids = np.random.default_rng(0).integers(0, TINY.vocab, 4 * TINY.context + 1, dtype="<u4")
    # a source's header: zeros would claim the embedded stream
    (d / "tiny.tokens").write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    (d / "fresh.ckpt").write_bytes(b"")
    synthesize(TINY, seed=1).write(d / "r0.bin")
    synthesize(TINY, seed=2, c0=1).write(d / "r1.bin")          # a continuation: needs --checkpoint
    (d / "src.py").write_text("def f():\n    return 1\n")
    return d


def commands(d: pathlib.Path, out: pathlib.Path) -> dict:
    """role → (argv builder taking the special path, is it an output, what the line calls it)."""
    run = ["run", "--profile", "tiny", "--backend", "cuda", "--quiet", "--steps", "1",
           "--directory", str(out / "run")]
    tokens, ckpt, result = str(d / "tiny.tokens"), str(d / "fresh.ckpt"), str(out / "r.bin")
    return {
        "run --tokens": (lambda p: [*run, "--tokens", p, "--checkpoint", ckpt, "--result", result],
                         False, "token cache"),
        "run --checkpoint": (lambda p: [*run, "--tokens", tokens, "--checkpoint", p,
                                        "--result", result], False, "checkpoint"),
        "run --result": (lambda p: [*run, "--tokens", tokens, "--checkpoint", ckpt, "--result", p],
                         True, "result file"),
        "run --source": (lambda p: [*run, "--tokens", tokens, "--checkpoint", ckpt,
                                    "--result", result, "--source", p], False, "source"),
        "verify RESULT": (lambda p: ["verify", p, "--tokens", tokens], False, "result file"),
        "verify --tokens": (lambda p: ["verify", str(d / "r0.bin"), "--tokens", p], False,
                            "token cache"),
        "verify --checkpoint": (lambda p: ["verify", str(d / "r1.bin"), "--tokens", tokens,
                                           "--checkpoint", p], False, "checkpoint"),
        "inspect RESULT": (lambda p: ["inspect", p], False, "result file"),
        "inspect --plot": (lambda p: ["inspect", str(d / "r0.bin"), "--plot", p], True, "plot"),
        "diff A": (lambda p: ["diff", p, str(d / "r0.bin")], False, "result file"),
        "diff B": (lambda p: ["diff", str(d / "r0.bin"), p], False, "result file"),
        "checkpoint show": (lambda p: ["checkpoint", "show", p], False, "checkpoint"),
        "checkpoint verify": (lambda p: ["checkpoint", "verify", p], False, "checkpoint"),
        "tokenize SOURCE": (lambda p: ["tokenize", p, "-o", str(out / "t.tokens")], False,
                            "source"),
        "tokenize -o": (lambda p: ["tokenize", str(d / "src.py"), "-o", p], True, "token cache"),
        "tokenize --tokenizer": (lambda p: ["tokenize", str(d / "src.py"), "-o",
                                            str(out / "t.tokens"), "--tokenizer", p], False,
                                 "tokenizer"),
    }


ROLES = list(commands(pathlib.Path("d"), pathlib.Path("o")))
# what is not a refusal: a directory is a legitimate source (it is walked), and a tokenize output
# in a missing directory is created with its parents
LEGITIMATE = {("run --source", "directory"), ("tokenize SOURCE", "directory"),
              ("tokenize -o", "missing")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("role", ROLES)
def test_special_path_is_refused_in_one_line(role, kind, inputs, tmp_path, capsys):
    if (role, kind) in LEGITIMATE:
        pytest.skip("a legitimate input for this argument")
    if role.startswith("tokenize"):
        pytest.importorskip("tokenizers")
    build, output, what = commands(inputs, tmp_path)[role]
    path = special(tmp_path, kind, output)
    before = sorted(os.listdir(tmp_path))
    with deadline():
        rc = cli.main(build(path))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert f"{what} " in line and (path[:60] in line or os.path.dirname(path) in line), line
    assert "(hint: " in line, line
    if kind in ("enotdir", "eloop", "enametoolong"):
        assert errno.errorcode[getattr(errno, kind.upper())] in line, line
    # nothing was created beside the special path (no result file, no token cache)
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("argv", [["checkpoint", "verify", "f"], ["checkpoint", "show", "f"],
                                  ["inspect", "f"], ["diff", "R", "f"],
                                  ["run", "--profile", "tiny", "--backend", "interpret",
                                   "--quiet", "--checkpoint", "f", "--result", "r.bin"]])
def test_issue_fifo_reproducers_return_at_once(argv, tmp_path):
    """The issue's reproducers as written: `mkfifo f`, then each command in a real process."""
    os.mkfifo(tmp_path / "f")
    synthesize(TINY, seed=3).write(tmp_path / "R")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "coppelius.cli", *argv], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "f is a FIFO, not a regular file" in lines[0]
    assert not (tmp_path / "r.bin").exists()


# ---------------------------------------------------------------------------- the helper

@pytest.mark.parametrize("kind", KINDS)
def test_open_regular_refuses_without_blocking(kind, tmp_path):
    path = special(tmp_path, kind)
    with deadline(), pytest.raises(UserError) as e:
        paths.open_regular(path, "thing")
    msg = str(e.value)
    assert msg.startswith(f"thing {path}") and "\n" not in msg and e.value.hint


def test_open_regular_clears_nonblocking_and_reads(tmp_path):
    import fcntl
    p = tmp_path / "a"
    p.write_bytes(b"abc")
    fd, st = paths.open_regular(p, "thing")
    try:
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
        assert st.st_size == 3 and os.read(fd, 8) == b"abc"
    finally:
        os.close(fd)
    assert paths.read_regular(p, "thing") == b"abc"


def test_os_refusal_names_path_meaning_and_errno():
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    r = paths.os_refusal(e, "token cache", "/x/y", "write", tk.TokenCacheRefused)
    assert isinstance(r, tk.TokenCacheRefused)
    assert str(r) == ("token cache /x/y: cannot write: No space left on device (ENOSPC) "
                      "(hint: free space on the filesystem holding the path)")


def test_check_output_accepts_new_and_overwritable_files(tmp_path):
    paths.check_output(tmp_path / "new", "out", overwrite=False, exists_hint="h")
    (tmp_path / "old").write_bytes(b"")
    paths.check_output(tmp_path / "old", "out", overwrite=True, exists_hint="h")
    with pytest.raises(UserError, match="exists") as e:
        paths.check_output(tmp_path / "old", "out", overwrite=False, exists_hint="pass --force")
    assert e.value.hint == "pass --force"
    paths.check_output(tmp_path / "a" / "b" / "c", "out", overwrite=False, exists_hint="h",
                       parents=True)


def test_an_oserror_that_reaches_the_frame_is_one_line(monkeypatch, capsys):
    """The frame's net: an OSError no command turned into a refusal still prints one line."""
    from coppelius.cli import profiles as cmd_profiles

    def boom(args):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "some/file/x")
    monkeypatch.setattr(cmd_profiles, "run", boom)     # register() binds it when main builds
    assert cli.main(["profiles"]) == 2
    assert capsys.readouterr().err == (
        "coppelius profiles: cannot use some/file/x: Not a directory (ENOTDIR) "
        f"(hint: {paths.HINTS[errno.ENOTDIR]})\n")


# ------------------------------------------------------------------------ hints, escaping

def _refusal_classes(trees) -> set[str]:
    names, grew = {"UserError"}, True
    while grew:
        grew = False
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in names:
                    bases = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                    if bases & names:
                        names.add(node.name)
                        grew = True
    return names


def test_every_refusal_in_the_code_carries_a_hint():
    """Every `UserError(...)` (or subclass) call in host/, plan/ and staging/ passes a hint: the
    second argument or `hint=`, and not a literal None."""
    files = sorted(p for d in ("host", "plan", "staging") for p in (REPO / d).rglob("*.py"))
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    classes = _refusal_classes(trees.values())
    assert {"CheckpointRefused", "ResultFileError", "TokenCacheRefused", "RunInterrupted"} <= classes
    calls, missing = 0, []
    for p, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name not in classes:
                continue
            calls += 1
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue            # UserError(*refused): a (message, hint) pair built elsewhere
            hint = node.args[1] if len(node.args) >= 2 else \
                next((k.value for k in node.keywords if k.arg == "hint"), None)
            if hint is None or (isinstance(hint, ast.Constant) and hint.value is None):
                missing.append(f"{p.relative_to(REPO)}:{node.lineno} {name}(...)")
    assert calls >= 50                   # (checkpoint_format.refuse and coppelius.staging.paths add more)
    assert not missing, "refusals without a hint:\n" + "\n".join(missing)


def test_magic_bytes_are_escaped_once(tmp_path):
    bad = b"CPLSCK\xd0T" + bytes(16376)
    (tmp_path / "m.ckpt").write_bytes(bad)
    with pytest.raises(checkpoints.CheckpointRefused) as e:
        checkpoints.read_header(tmp_path / "m.ckpt")
    assert r"magic differs: file 'CPLSCK\xd0T' expected 'CPLSCKPT'" in str(e.value)
    assert "\\\\" not in str(e.value)


def test_fsync_directory_strict_raises_what_the_lenient_form_lets_go(tmp_path):
    # the checkpoint (strict) must not call a publication durable that may not be; result files and
    # token caches (lenient) let a directory the OS will not open or fsync go, their data synced
    paths.fsync_directory(tmp_path)
    paths.fsync_directory(tmp_path, strict=True)
    missing = tmp_path / "gone"
    paths.fsync_directory(missing)
    with pytest.raises(FileNotFoundError):
        paths.fsync_directory(missing, strict=True)
    plain = tmp_path / "file"
    plain.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        paths.fsync_directory(plain, strict=True)
