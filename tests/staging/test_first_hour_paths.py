"""Paths on the first hour: a new file written through `atomic_write` gets an ordinary new file's
mode (mkstemp's 0600 would hide a token cache from the group), and a directory path that names a
file, FIFO or device is `Not a directory (ENOTDIR)`, not mkdir's misleading EEXIST."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from coppelius.staging import paths
from coppelius.staging import tokens as tk
from coppelius.staging.errors import UserError


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_new_file_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with paths.atomic_write(tmp_path / "c.tokens", "token cache") as f:
            f.write(tk.header_bytes(0, 0) + np.zeros(3, "<u4").tobytes())
        assert paths.current_umask() == umask
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "c.tokens").stat().st_mode) == mode


@pytest.mark.parametrize("kind", ["file", "fifo", "device", "through a file"])
def test_a_directory_that_is_not_one_is_enotdir(tmp_path, kind):
    where = tmp_path / "d"
    if kind == "file":
        where.write_text("x")
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "device":
        where = os.devnull
    else:
        (tmp_path / "f").write_text("x")
        where = tmp_path / "f" / "d"
    with pytest.raises(UserError) as e:
        paths.check_directory(where, "directory")
    assert f"directory {where}: cannot create: Not a directory (ENOTDIR)" == e.value.message
    assert "File exists" not in str(e.value)


def test_a_missing_or_existing_directory_passes(tmp_path):
    paths.check_directory(tmp_path, "directory")
    paths.check_directory(tmp_path / "new" / "deeper", "directory")
    assert not (tmp_path / "new").exists()
