"""Truncated files, trailing bytes and non-result files are refused with one-line reasons."""
from __future__ import annotations

import numpy as np
import pytest

from coppelius import cli
from coppelius.results import reader as RF
from coppelius.plan import profiles as P
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS

from tests.support.result_synth import synthesize


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rf") / "tiny.res"
    synthesize(P.get("tiny"), seed=2).write(path)
    return path.read_bytes()


def _refusal(tmp_path, data: bytes, name="bad.res") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(RF.ResultFileError) as e:
        RF.read(path)
    text = str(e.value)
    assert "\n" not in text and text.startswith(str(path)), text
    return text


def test_truncated_at_every_section_boundary(tmp_path, tiny_file):
    rf_sizes = RS.section_offsets(P.get("tiny"), 8, 10)
    cuts = sorted({o + d for o, _ in rf_sizes.values() for d in (-1, 0, 1)} - {0, len(tiny_file)})
    for cut in cuts:
        if cut <= 0 or cut >= len(tiny_file):
            continue
        text = _refusal(tmp_path, tiny_file[:cut])
        status_at = rf_sizes["status"][0]
        if cut >= status_at + L.STATUS_BLOCK_BYTES:
            assert "truncated" in text and f"ends {len(tiny_file) - cut:,} bytes short" in text
        elif cut >= status_at + len(R.STATUS_MAGIC):
            assert "truncated: a status block starts at offset" in text
        else:
            assert "no status block" in text or "shorter than any result file" in text, text


def test_truncated_inside_every_timestamp_entry(tmp_path, tiny_file):
    for short in range(1, 10 * L.TIMESTAMP_ENTRY_BYTES + 1, 37):
        text = _refusal(tmp_path, tiny_file[:-short])
        assert f"ends {short:,} bytes short, inside the timestamp table" in text


@pytest.mark.parametrize("extra", [1, 63, 64, 4096, 4096 + 64, 100_000])
def test_trailing_bytes(tmp_path, tiny_file, extra):
    text = _refusal(tmp_path, tiny_file + bytes(extra))
    assert f"{extra:,} trailing byte" in text and "tiny result file of 58,464 bytes" in text


def test_killed_run_without_tail(tmp_path, tiny_file):
    fwd = L.record_forward_bytes(P.get("tiny"))
    text = _refusal(tmp_path, tiny_file[:fwd + 3 * L.STEP_WINDOW_BYTES])
    assert "run killed before writing its tail" in text and "forward part + 3 step windows" in text


@pytest.mark.parametrize("data,needle", [
    (b"", "empty file"),
    (b"CPLSCKPT" + bytes(16376), "checkpoint file"),
    (b"# just some text\n" * 10, "shorter than any result file"),
    (np.random.default_rng(0).bytes(300_000), "no status block (magic COPPSTAT) anywhere"),
    (b"\x89PNG\r\n\x1a\n" + bytes(60_000), "no status block"),
])
def test_not_result_files(tmp_path, data, needle):
    assert needle in _refusal(tmp_path, data)


def test_missing_file(tmp_path):
    with pytest.raises(RF.ResultFileError, match="result file .*absent.res does not exist"):
        RF.read(tmp_path / "absent.res")


def _patched_status(data: bytes, prof, steps, issues, **fields) -> bytes:
    at = RS.section_offsets(prof, steps, issues)["status"][0]
    st = R.STATUS_BLOCK.unpack(data[at:at + L.STATUS_BLOCK_BYTES])
    st.update(fields)
    return data[:at] + R.STATUS_BLOCK.pack(**st) + data[at + L.STATUS_BLOCK_BYTES:]


def test_bad_status_fields_are_named(tmp_path, tiny_file):
    prof = P.get("tiny")
    assert "status block version 3" in _refusal(
        tmp_path, _patched_status(tiny_file, prof, 8, 10, version=3))
    assert "status block outcome 9" in _refusal(
        tmp_path, _patched_status(tiny_file, prof, 8, 10, outcome=9))
    # steps_completed that disagrees with the file's windows: the block is not where it says
    text = _refusal(tmp_path, _patched_status(tiny_file, prof, 8, 10, steps_completed=7))
    assert "not where its own step count puts it" in text
    # gpPut that disagrees with the table: reported against the size
    text = _refusal(tmp_path, _patched_status(tiny_file, prof, 8, 10, gp_put=11))
    assert "ends 64 bytes short" in text


def test_last_byte_of_magic(tmp_path, tiny_file):
    at = RS.section_offsets(P.get("tiny"), 8, 10)["status"][0]
    data = bytearray(tiny_file)
    data[at + 7] ^= 1
    assert "no status block" in _refusal(tmp_path, bytes(data))


def test_cli_one_line_exit_2(tmp_path, tiny_file, capsys):
    path = tmp_path / "cut.res"
    path.write_bytes(tiny_file[:-5])
    for argv in (["inspect", str(path)], ["inspect", str(path), "--json"],
                 ["diff", str(path), str(path)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and "truncated" in err, err
