"""`coppelius export --overwrite` replaces only a previous export: a directory holding the
checkpoint being read, a `.git` folder, a user's file, or a config.json without the export's
`coppelius` block is refused (with or without --overwrite), left exactly as it was, and the
refusal's hint — a command naming a new directory — works as printed."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
from pathlib import Path

import pytest

from coppelius.cli import main
from tests.support.first_hour import hint_of, refusal

pytest.importorskip("safetensors", reason="the `hf` extra (safetensors) is not installed")

from coppelius.export import writer  # noqa: E402  (after the skip: needs safetensors)


def tree(root: Path) -> dict:
    """Every entry under `root`: kind, size and bytes of files, mtime (of directories too)."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        body = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), body, st.st_mtime_ns)
    return out




def follow(capsys, hint: str) -> Path:
    """Run the hint's `coppelius export …` as printed; returns the directory it wrote."""
    cmd = re.search(r"(coppelius export .*)$", hint).group(1)
    argv = shlex.split(cmd)[1:]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    return Path(argv[-1])


def plant(kind: str, target: Path, checkpoint: Path) -> Path:
    """A user's target directory of one kind; returns the checkpoint path to export."""
    target.mkdir()
    if kind == "the checkpoint being exported":
        shutil.copy(checkpoint, target / "tiny.ckpt")
        (target / "tiny-result-c0.bin").write_bytes(b"a result")
        return target / "tiny.ckpt"
    if kind == "a git repository":
        (target / ".git" / "objects").mkdir(parents=True)
        (target / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        (target / "main.py").write_text("print('mine')\n")
    elif kind == "a user file":
        (target / "notes.txt").write_text("my notes\n")
    elif kind == "a config.json of another model":
        (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    elif kind == "an export with a user file beside it":
        target.rmdir()
        writer.export(read(checkpoint), target)
        (target / "notes.txt").write_text("my notes\n")
    return checkpoint


def read(path):
    from coppelius import forensics
    return forensics.read_checkpoint(path)


KINDS = ["the checkpoint being exported", "a git repository", "a user file",
         "a config.json of another model", "an export with a user file beside it"]


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_a_directory_that_is_not_an_export_is_never_replaced(tiny_checkpoint, tmp_path, capsys,
                                                              kind, overwrite):
    target = tmp_path / "project"
    ck = plant(kind, target, tiny_checkpoint[0])
    before = tree(tmp_path)
    line = refusal(capsys, ["export", str(ck), str(target)]
                        + (["--overwrite"] if overwrite else []))
    assert tree(tmp_path) == before, f"{kind}: the refusal changed {tmp_path}"
    assert "is not a previous export" in line and "--overwrite" not in hint_of(line), line
    out = follow(capsys, hint_of(line))                 # the hint, run as printed
    assert (out / "model.safetensors").is_file() and not os.path.lexists(target / ".old")
    after = tree(tmp_path)
    for name, entry in before.items():    # every planted entry as it was (the hint's new
        if name not in (".", "project"):  # directory changes only the mtime of its parent)
            assert after[name] == entry, name


def test_the_demo_directory_case(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """`export coppelius-demo/tiny.ckpt coppelius-demo --overwrite`, the issue's loss: refused,
    and its hint exports into coppelius-demo/tiny-hf."""
    monkeypatch.chdir(tmp_path)
    demo = Path("coppelius-demo")
    demo.mkdir()
    shutil.copy(tiny_checkpoint[0], demo / "tiny.ckpt")
    (demo / "tiny-result-c0.bin").write_bytes(b"r")
    before = tree(tmp_path)
    line = refusal(capsys, ["export", "coppelius-demo/tiny.ckpt", "coppelius-demo",
                                 "--overwrite"])
    assert "holds the checkpoint being exported" in line, line
    assert hint_of(line) == ("name a new directory: coppelius export coppelius-demo/tiny.ckpt "
                             "coppelius-demo/tiny-hf")
    assert tree(tmp_path) == before
    assert follow(capsys, hint_of(line)) == demo / "tiny-hf"
    assert sorted(p.name for p in demo.iterdir()) == ["tiny-hf", "tiny-result-c0.bin",
                                                      "tiny.ckpt"]


def test_a_previous_export_is_replaced_and_only_its_files_go(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    ck = str(tiny_checkpoint[0])
    assert main(["export", ck, str(out)]) == 0
    fp32 = (out / "model.safetensors").stat().st_size
    line = refusal(capsys, ["export", ck, str(out), "--dtype", "bf16"])
    assert hint_of(line).startswith("pass --overwrite"), line
    assert main(["export", ck, str(out), "--dtype", "bf16", "--overwrite"]) == 0
    assert (out / "model.safetensors").stat().st_size < fp32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"], "nothing left aside"
    assert sorted(p.name for p in out.iterdir()) == sorted(writer.EXPORT_FILES)


def test_a_file_that_appears_while_writing_is_kept(tiny_checkpoint, tmp_path, monkeypatch):
    """The directory is checked again just before the rename: a file a user saved into the old
    export meanwhile makes the export refuse, and nothing is removed."""
    out = tmp_path / "hf"
    writer.export(read(tiny_checkpoint[0]), out)
    real = writer.write_files

    def meanwhile(where, checkpoint, dtype):
        (out / "notes.txt").write_text("saved meanwhile\n")
        return real(where, checkpoint, dtype)
    monkeypatch.setattr(writer, "write_files", meanwhile)
    with pytest.raises(writer.ExportRefused, match="notes.txt"):
        writer.export(read(tiny_checkpoint[0]), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "saved meanwhile\n"
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"], "the temporary is removed"
