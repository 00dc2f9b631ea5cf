"""`coppelius checkpoint show|verify`: exit codes, one-line refusals, what is shown."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from coppelius import checkpoints
from coppelius.checkpoints import format as CF
from coppelius.cli import main
from coppelius.plan import profiles

TINY = profiles.get("tiny")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "t.ckpt"
    P = np.linspace(-1, 1, TINY.parameter_count, dtype=np.float32)
    checkpoints.publish(path, TINY, P, P * 2, P * 3, update_count=4)
    return path


def test_verify_valid_exits_zero(ckpt, capsys):
    assert main(["checkpoint", "verify", str(ckpt)]) == 0
    out = capsys.readouterr().out
    payload = ckpt.read_bytes()[CF.HEADER_BYTES:]
    assert "valid" in out and "profile tiny" in out and "update count 4" in out
    assert hashlib.sha256(payload).hexdigest() in out


def test_verify_with_other_profile_names_the_mismatch(ckpt, capsys):
    assert main(["checkpoint", "verify", str(ckpt), "--profile", "coppelius"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "the file is a 'tiny' checkpoint, this run uses profile 'coppelius'" in err


def test_verify_damaged_last_chunk_exits_nonzero(ckpt, tmp_path, capsys):
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 0x10
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(bytes(data))
    assert main(["checkpoint", "verify", str(bad)]) == 2
    assert "chunk 2 of 2 digest differs" in capsys.readouterr().err


@pytest.mark.parametrize("content, words", [(None, "does not exist"),
                                            (b"", "0 bytes"),
                                            (b"CPLSCKPT", "file too short: 8 bytes")])
def test_verify_refusals(tmp_path, capsys, content, words):
    p = tmp_path / "x.ckpt"
    if content is not None:
        p.write_bytes(content)
    assert main(["checkpoint", "verify", str(p)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_verify_unknown_identities_without_profile(ckpt, tmp_path, capsys):
    h = CF.Header.decode(ckpt.read_bytes())
    ids = dict(h.identities, initialization=h.identities["initialization"].replace(b"=2026",
                                                                                   b"=2027"))
    p = tmp_path / "other.ckpt"
    p.write_bytes(CF.Header(**{**h.__dict__, "identities": ids}).encode()
                  + ckpt.read_bytes()[CF.HEADER_BYTES:])
    assert main(["checkpoint", "verify", str(p)]) == 2
    assert "match no known profile" in capsys.readouterr().err
    assert main(["checkpoint", "verify", str(p), "--profile", "tiny"]) == 2
    assert "initialization identity differs" in capsys.readouterr().err


def test_show_json_fields_identities_digests(ckpt, capsys):
    assert main(["checkpoint", "show", str(ckpt), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    h = CF.Header.decode(ckpt.read_bytes())
    assert doc["update_count"] == 4 and doc["profile"] == "tiny" and doc["size_ok"]
    assert doc["payload_bytes"] == TINY.payload_bytes and doc["chunk_count"] == 2
    assert doc["identities"] == {k: v.decode() for k, v in TINY.identities.items()}
    assert doc["chunk_sha256"] == [d.hex() for d in h.digests]
    assert doc["header_sha256"] == h.header_digest.hex()


def test_show_table_and_zero_byte(ckpt, tmp_path, capsys):
    assert main(["checkpoint", "show", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "update count" in out and "tiny" in out and "chunk digests" in out
    empty = tmp_path / "e.ckpt"
    empty.write_bytes(b"")
    assert main(["checkpoint", "show", str(empty)]) == 0
    assert "fresh" in capsys.readouterr().out
