"""coppelius.staging.paths.atomic_write, the one write-and-rename of the token cache and the embedded stream:
the bytes arrive whole or not at all, the temporary lives beside the target, and both the file
and its directory are synced."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from coppelius.staging import paths
from coppelius.staging.errors import UserError

PAYLOAD = bytes(range(256)) * 129 + b"tail"          # not a multiple of any block size


def _leftovers(directory: Path, keep: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != keep)


def test_the_bytes_arrive_whole_and_no_temporary_stays(tmp_path):
    out = tmp_path / "cache.tokens"
    with paths.atomic_write(out, "token cache") as f:
        f.write(PAYLOAD[:1000])
        assert not out.exists(), "the target appeared before the block ended"
        f.write(PAYLOAD[1000:])
    assert out.read_bytes() == PAYLOAD
    assert _leftovers(tmp_path, out.name) == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("existing", [None, b"the old cache"])
def test_an_interrupted_write_leaves_no_partial_file(tmp_path, interrupt, existing):
    out = tmp_path / "cache.tokens"
    if existing is not None:
        out.write_bytes(existing)
    with pytest.raises(interrupt):
        with paths.atomic_write(out, "token cache") as f:
            f.write(PAYLOAD)
            f.flush()
            raise interrupt()
    if existing is None:
        assert not out.exists(), "a partial file was left at the target"
    else:
        assert out.read_bytes() == existing, "the old file was replaced by a partial one"
    assert _leftovers(tmp_path, out.name) == [], "the temporary was left behind"


def test_the_temporary_is_beside_the_target_and_synced_before_the_rename(tmp_path, monkeypatch):
    out = tmp_path / "sub" / "stream.tokens"
    out.parent.mkdir()
    events = []
    real_fsync, real_replace, real_dir_sync = os.fsync, os.replace, paths.fsync_directory

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst)

    def fsync_directory(directory, strict=False):
        events.append(("fsync_directory", Path(directory), out.exists()))
        real_dir_sync(directory, strict)

    monkeypatch.setattr(paths.os, "fsync", fsync)
    monkeypatch.setattr(paths.os, "replace", replace)
    monkeypatch.setattr(paths, "fsync_directory", fsync_directory)
    with paths.atomic_write(out, "embedded stream") as f:
        f.write(PAYLOAD)
    (_, synced), (_, src, dst), (_, directory, named), *rest = events
    assert rest == [("fsync", os.fspath(out.parent))], rest        # the directory's own fsync
    assert Path(src).parent == out.parent and Path(src).name.startswith(f".{out.name}.")
    assert synced == src, "the file synced is not the temporary that was renamed"
    assert dst == os.fspath(out)
    assert directory == out.parent and named, "the directory was not synced after the rename"
    assert out.read_bytes() == PAYLOAD


def test_a_temporary_that_cannot_be_created_is_a_refusal(tmp_path):
    out = tmp_path / "missing" / "cache.tokens"
    with pytest.raises(UserError) as e:
        with paths.atomic_write(out, "token cache"):
            pytest.fail("the block ran without a file")
    assert str(out) in e.value.message and "token cache" in e.value.message
    assert e.value.hint
