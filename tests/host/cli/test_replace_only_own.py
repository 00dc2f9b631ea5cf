"""No command replaces a file it did not write: every path a command writes over is checked
first, and a user's file planted there — the checkpoint being continued, a token cache, text, a
photo — is refused by name (exit 2, one line, the file byte for byte as it was), with or without
--overwrite/--force, while the command's own earlier output is still replaced.

The commands: `run --result/--digests` (and the telemetry file beside a cuda run's result),
`tokenize -o` and `--train-tokenizer`, `inspect --plot`, `fleet-script -o`, `node --junit`, and
checkpoint publication (the temporaries it cleans up).  `export` has its own file
(tests/host/export/test_export_safety.py).  No run reaches a backend: every check comes first."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from coppelius import checkpoints as ckpt
from coppelius import cli
from coppelius.plan import profiles
from coppelius.results import reader as RF
from coppelius.staging import tokens as tk

from tests.support.result_synth import synthesize

TINY = profiles.get("tiny")
PHOTO = b"\x89PNG\r\n\x1a\n" + bytes(64)       # a user's image: a PNG of someone else's
NOTES = b"my notes, not to be lost\n" * 41


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Every check here comes before a backend opens or a node starts its runs: reaching one
    fails at once (and never trains over a planted file)."""
    import coppelius.node
    from coppelius.run import loop

    def reached(*args, **kwargs):
        raise AssertionError("the command went past its checks")
    monkeypatch.setattr(loop, "make_backend", reached)
    monkeypatch.setattr(coppelius.node, "run_node", reached)


def refused(capsys, argv, planted: Path, *fragments) -> str:
    """`coppelius ARGV` refuses in one line naming `planted`, which is left as it was."""
    before = planted.read_bytes()
    assert cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(planted) in lines[0] and "refusing to replace it" in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert planted.read_bytes() == before, f"{planted} was changed"
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint, a token cache, a result file."""
    d = tmp_path_factory.mktemp("own")
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    ckpt.publish(d / "tiny.ckpt", TINY, P, P, P, update_count=2)
    ids = np.random.default_rng(1).integers(0, TINY.vocab, 4 * TINY.context + 1, dtype="<u4")
    (d / "text.tokens").write_bytes(tk.header_bytes(1, 1) + ids.tobytes())
    synthesize(TINY, seed=3).write(d / "r.bin")
    return d


def run_argv(files, tmp_path, **override) -> list:
    args = {"--profile": "tiny", "--backend": "interpret", "--tokens": files / "text.tokens",
            "--checkpoint": files / "tiny.ckpt", "--result": tmp_path / "new.bin",
            "--directory": tmp_path / "d", "--steps": 1}
    args.update(override)
    return ["run", "--quiet", "--overwrite", *[x for kv in args.items() for x in kv]]


# ----------------------------------------------------------------------------------- run

@pytest.mark.parametrize("planted", ["the checkpoint", "the token cache", "notes"])
def test_run_overwrite_replaces_only_a_result_file(files, tmp_path, capsys, planted):
    """`--result` naming the checkpoint being continued, the token cache it trains on, or a
    user's notes: refused with --overwrite, before any backend opens."""
    target = {"the checkpoint": files / "tiny.ckpt", "the token cache": files / "text.tokens",
              "notes": tmp_path / "notes.txt"}[planted]
    if planted == "notes":
        target.write_bytes(NOTES)
    refused(capsys, run_argv(files, tmp_path, **{"--result": target}), target,
            "result file", "is not a result file")
    assert not (tmp_path / "d").exists()


def test_a_result_files_own_kinds_are_replaceable(files, tmp_path):
    """What --overwrite may replace: a result file, an empty file, a killed run's windows."""
    assert RF.recognize(files / "r.bin") is None
    (tmp_path / "empty.bin").write_bytes(b"")
    assert RF.recognize(tmp_path / "empty.bin") is None
    rf = RF.read(files / "r.bin")
    killed = tmp_path / "killed.bin"           # the forward part and two windows, no tail
    killed.write_bytes(bytes(rf.raw[:rf.offsets["steps"][0] + 2 * 4096]))
    assert RF.recognize(killed) is None
    text = tmp_path / "same-size.txt"          # a text file of that very size is not one
    text.write_bytes((NOTES * 100)[:killed.stat().st_size])
    assert "no file `coppelius run` writes" in RF.recognize(text)
    assert "checkpoint" in RF.recognize(files / "tiny.ckpt")


def test_run_digests_overwrite_replaces_only_a_digests_file(files, tmp_path, capsys):
    notes = tmp_path / "a.json"
    notes.write_text(json.dumps({"my": "settings"}))
    refused(capsys, run_argv(files, tmp_path) + ["--digests", notes], notes,
            "digests file", 'without "format": "coppelius-digests"')
    notes.write_bytes(NOTES)
    refused(capsys, run_argv(files, tmp_path) + ["--digests", notes], notes, "not JSON")


def test_a_cuda_runs_telemetry_file_replaces_only_a_telemetry_file(files, tmp_path, capsys):
    """The GPU's readings go beside the result (`<result>.telemetry.json`): a user's file
    there is refused before the run, a run on the interpreter (which writes none) is not."""
    beside = tmp_path / "new.bin.telemetry.json"
    beside.write_bytes(NOTES)
    refused(capsys, run_argv(files, tmp_path, **{"--backend": "cuda"}), beside, "telemetry file")


# ------------------------------------------------------------------------------ tokenize

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    pytest.importorskip("tokenizers")
    d = tmp_path_factory.mktemp("src")
    shutil.copy(os.__file__, d / "os.py")
    return d


@pytest.mark.parametrize("planted", ["notes", "the checkpoint", "the result file"])
def test_tokenize_force_replaces_only_a_token_cache(files, sources, tmp_path, capsys, planted):
    target = tmp_path / "out"
    if planted == "notes":
        target.write_bytes(NOTES[:16 + 4 * 100])        # even a size of 16 + 4k bytes
    else:
        shutil.copy(files / ("tiny.ckpt" if planted == "the checkpoint" else "r.bin"), target)
    refused(capsys, ["tokenize", "--profile", "tiny", sources, "-o", target, "--force"], target,
            "token cache", "is not a token cache")
    cache = tmp_path / "own.tokens"
    shutil.copy(files / "text.tokens", cache)           # an earlier cache: replaced
    assert cli.main(["tokenize", "--profile", "tiny", str(sources), "-o", str(cache),
                     "--force"]) == 0
    assert cache.read_bytes() != (files / "text.tokens").read_bytes()


def test_train_tokenizer_force_replaces_only_a_tokenizer(sources, tmp_path, capsys):
    target = tmp_path / "my-tokenizer.json"
    target.write_text(json.dumps({"editor.fontSize": 14}))
    refused(capsys, ["tokenize", "--train-tokenizer", target, "--vocab", "300", sources,
                     "--force"], target, "tokenizer", "no tokenizers JSON file")
    target.unlink()
    argv = ["tokenize", "--train-tokenizer", str(target), "--vocab", "300", str(sources)]
    assert cli.main(argv) == 0 and cli.main(argv + ["--force"]) == 0


# ------------------------------------------------------------------------------- inspect

@pytest.mark.parametrize("planted", ["the result file", "a photo", "notes"])
def test_inspect_plot_replaces_only_its_own_plot(files, tmp_path, capsys, planted):
    pytest.importorskip("matplotlib")
    result = tmp_path / "r.bin"
    shutil.copy(files / "r.bin", result)
    target = {"the result file": result, "a photo": tmp_path / "holiday.png",
              "notes": tmp_path / "notes.txt"}[planted]
    if planted == "a photo":
        target.write_bytes(PHOTO)
    elif planted == "notes":
        target.write_bytes(NOTES)
    refused(capsys, ["inspect", result, "--plot", target], target, "plot")
    own = tmp_path / "plot.png"
    for _ in range(2):                                  # its own plot: written, then replaced
        assert cli.main(["inspect", str(result), "--plot", str(own)]) == 0
    capsys.readouterr()
    assert own.read_bytes().startswith(PHOTO[:8])


# ------------------------------------------------------------------- fleet-script, node

def test_fleet_script_force_replaces_only_a_fleet_script(tmp_path, capsys):
    target = tmp_path / "run.sh"
    target.write_bytes(b"#!/bin/bash\necho my own job\n")
    refused(capsys, ["fleet-script", "array", "-o", target, "--force"], target, "script")
    own = tmp_path / "coppelius-array.sh"
    argv = ["fleet-script", "array", "-o", str(own)]
    assert cli.main(argv) == 0 and cli.main(argv + ["--force"]) == 0


def test_node_junit_replaces_only_its_own_report(tmp_path, capsys):
    """Refused before any run starts (no GPU or CPU slot is touched)."""
    target = tmp_path / "report.xml"
    target.write_bytes(b'<?xml version="1.0"?><testsuites><testsuite name="pytest"/>'
                       b"</testsuites>")
    refused(capsys, ["node", "--profile", "tiny", "--backend", "interpret", "--work",
                     tmp_path / "n", "--junit", target], target, "JUnit file")
    assert not (tmp_path / "n").exists()
    from coppelius.cli.node import junit_recognize
    own = tmp_path / "own.xml"
    own.write_bytes(b'<?xml version="1.0"?><testsuites><testsuite name="coppelius node h"/>'
                    b"</testsuites>")
    assert junit_recognize(own) is None


# ------------------------------------------------------------------ checkpoint publication

def test_publication_removes_only_its_own_dead_temporaries(tmp_path):
    """A publication renames over the checkpoint it continues and removes the temporaries of
    dead publishers (".NAME.tmp.<pid>.<8 hex>"); a user's files beside it, however named, stay."""
    path = tmp_path / "tiny.ckpt"
    planted = {name: NOTES for name in (".tiny.ckpt.tmp.notes", "tiny.ckpt.bak",
                                        ".tiny.ckpt.tmp.1.notes", "tiny.ckpt.lock.txt")}
    for name, body in planted.items():
        (tmp_path / name).write_bytes(body)
    dead = tmp_path / f".tiny.ckpt{ckpt.TEMP_MARK}{2 ** 22 + 7}.0123abcd"   # no such pid
    dead.write_bytes(b"half a checkpoint")
    P = np.zeros(TINY.parameter_count, np.float32)
    ckpt.publish(path, TINY, P, P, P, update_count=1)
    assert not dead.exists()
    for name, body in planted.items():
        assert (tmp_path / name).read_bytes() == body, name
    assert re.fullmatch(r"\d+", str(ckpt.read_header(path)[0].update_count))
