"""The shipped BPE tokenizer and `coppelius tokenize` — round trips, cache bytes, refusals."""
from __future__ import annotations

import time

import numpy as np
import pytest

from coppelius import cli
from coppelius import tokenizer as tz
from coppelius.staging.errors import EXIT_USER_ERROR
from coppelius.plan import profiles
from coppelius.staging import tokens as tk

COPPELIUS = profiles.get("coppelius")


@pytest.fixture(scope="module")
def encoder():
    return tz.Encoder(tz.load())


@pytest.fixture(scope="module")
def stdlib():
    files = tz.stdlib_python_files()
    assert len(files) > 500, "the standard library's .py files were not found"
    return files, [tz.read_text(f) for f in files]


def test_shipped_tokenizer(encoder):
    tok = encoder.tokenizer
    assert tz.vocabulary_size(tok) == COPPELIUS.vocab
    assert tz.end_of_text_id(tok) == 0
    assert encoder.fast, "the shipped tokenizer must allow the cached piecewise encoder"


def test_round_trip_every_stdlib_file(encoder, stdlib):
    files, texts = stdlib
    t = time.perf_counter()
    ids = encoder.encode(texts)
    t_enc = time.perf_counter() - t
    decoded = encoder.tokenizer.decode_batch([a.tolist() for a in ids], skip_special_tokens=False)
    bad = [str(f) for f, a, b in zip(files, texts, decoded) if a != b]
    mb = sum(len(x.encode("utf-8")) for x in texts) / 1e6
    print(f"{len(files)} files, {mb:.1f} MB encoded in {t_enc:.2f} s")
    assert not bad, f"{len(bad)} files do not round-trip, first {bad[0]}"
    assert all(int(a.max(initial=0)) < COPPELIUS.vocab for a in ids)


def test_piecewise_encoder_equals_tokenizer(encoder, stdlib):
    """The cached piece encoder is exact: same ids as the tokenizer's own encoder (every 4th file,
    plus texts with awkward whitespace, non-ASCII and the special token)."""
    files, texts = stdlib
    sample = texts[::4] + ["", " ", "\n\n", "x\x1c y\u00a0z\u2028", "a  \n\t b", "é__init__ 123456",
                           "tail <|endoftext|>middle<|endoftext|>", "\r\n\x0b\x0c  "]
    ours = encoder.encode(sample)
    ref = encoder.tokenizer.encode_batch_fast(sample)
    for i, (a, e) in enumerate(zip(ours, ref)):
        assert a.tolist() == e.ids, f"text {i} ({sample[i][:40]!r}) differs"


def make_sources(root):
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("def f(x):\n    return x + 1\n")
    (root / "pkg" / "sub" / "b.txt").write_text("héllo wörld\n")
    (root / "pkg" / "sub" / "c.txt").write_bytes(b"caf\xe9 latin-1\n")   # not UTF-8
    return root / "pkg"


def tokenize(*argv):
    return cli.main(["tokenize", *map(str, argv)])


def test_tokenize_directory_writes_exact_cache_twice(tmp_path, encoder, capsys):
    src = make_sources(tmp_path)
    out1, out2 = tmp_path / "one.tokens", tmp_path / "two.tokens"
    assert tokenize(src, "-o", out1) == 0
    assert tokenize(src, "-o", out2) == 0
    assert out1.read_bytes() == out2.read_bytes()
    err = capsys.readouterr().err
    assert "3 file(s)" in err and "1 file(s) not UTF-8" in err
    raw = out1.read_bytes()
    mtime, size = tk.source_fingerprint([src])
    assert raw[:16] == tk.header_bytes(mtime, size)
    files = tk.source_files([src])
    want = []
    for f in files:
        want += encoder.encode([tz.read_text(f)])[0].tolist() + [0]
    got = np.frombuffer(raw[16:], "<u4")
    assert got.tolist() == want
    assert encoder.decode(got).split("<|endoftext|>")[:-1] == [tz.read_text(f) for f in files]
    cache = tk.TokenCache.open(out1, profiles.get("tiny"))
    cache.check_source(str(src))
    # editing a source makes the cache stale
    (src / "a.py").write_text("def f(x):\n    return x + 2\n\n")
    with pytest.raises(tk.TokenCacheRefused, match="stale"):
        cache.check_source(str(src))


def test_several_sources_newest_mtime_total_size(tmp_path):
    src = make_sources(tmp_path)
    a, b = src / "a.py", src / "sub" / "b.txt"
    out = tmp_path / "c.tokens"
    assert tokenize(a, b, "-o", out) == 0
    assert out.read_bytes()[:16] == tk.header_bytes(max(a.stat().st_mtime_ns, b.stat().st_mtime_ns),
                                                    a.stat().st_size + b.stat().st_size)


def refused(capsys, rc, *fragments):
    assert rc == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


def test_refuses_tokenizer_with_more_than_v_ids(tmp_path, capsys):
    src = make_sources(tmp_path)
    out = tmp_path / "x.tokens"
    from coppelius import tokenizer as tz
    refused(capsys, tokenize(src, "-o", out, "--profile", "tiny", "--tokenizer",
                             tz.DEFAULT_TOKENIZER), "has 12288 ids", "tiny vocabulary of 512")
    assert not out.exists()
    # without --tokenizer the tiny profile takes the shipped tokenizer of its 512 ids
    assert tokenize(src, "-o", out, "--profile", "tiny") == 0


def test_refusals(tmp_path, capsys):
    src = make_sources(tmp_path)
    out = tmp_path / "x.tokens"
    out.write_bytes(b"")
    refused(capsys, tokenize(src, "-o", out), "exists", "--force")
    assert tokenize(src, "-o", out, "--force") == 0
    capsys.readouterr()
    refused(capsys, tokenize(tmp_path / "missing", "-o", tmp_path / "y"), "missing", "does not exist")
    (src / "blob.bin").write_bytes(b"\x7fELF\0\0\1")
    refused(capsys, tokenize(src, "-o", tmp_path / "y"), "blob.bin", "NUL bytes")
    assert not list(tmp_path.glob(".y.*")), "a temporary file was left behind"
    refused(capsys, tokenize(src / "a.py", "-o", tmp_path / "y", "--tokenizer", tmp_path / "no.json"),
            "no.json", "does not exist")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    refused(capsys, tokenize(src / "a.py", "-o", tmp_path / "y", "--tokenizer", bad),
            "not a tokenizers JSON file")
    refused(capsys, tokenize(src / "a.py", "-o", tmp_path / "y", "--profile", "nano"), "nano")


# ---- worker processes, the same bytes for every --jobs ----

from coppelius.cli import tokenize as cmd_tokenize  # noqa: E402


def make_corpus(root, n=9):
    """n files, the first far larger than the rest, so with one file per batch its batch finishes
    last while the small ones come back first."""
    (root / "corpus").mkdir()
    big = "".join(f"def f{i}(x, y=({i}, 'é')):\n    return x * {i} + y[0]  # {i}\n"
                  for i in range(4000))
    (root / "corpus" / "a_big.py").write_text(big)
    for i in range(1, n):
        (root / "corpus" / f"f{i:02d}.py").write_text(f"x{i} = {i}\n" * i + "\t\n  \n")
    (root / "corpus" / "g.txt").write_text("a <|endoftext|> b\n")          # the slow path
    (root / "corpus" / "h.txt").write_bytes(b"")                             # empty: just EOT
    return root / "corpus"


@pytest.fixture
def one_file_per_batch(monkeypatch):
    monkeypatch.setattr(cmd_tokenize, "BATCH_BYTES", 1)


def test_jobs_give_byte_identical_cache_in_source_order(tmp_path, encoder, capsys,
                                                         one_file_per_batch):
    src = make_corpus(tmp_path)
    files = tk.source_files([src])
    assert len(cmd_tokenize.batches(files, cmd_tokenize.BATCH_BYTES)) == len(files) == 11
    caches = {}
    for jobs in (1, 2, 3):
        caches[jobs] = tmp_path / f"j{jobs}.tokens"
        assert tokenize(src, "-o", caches[jobs], "--jobs", jobs) == 0
        assert f"{jobs} job(s)" in capsys.readouterr().err
    raw = caches[1].read_bytes()
    assert caches[2].read_bytes() == raw and caches[3].read_bytes() == raw
    want = np.concatenate([np.append(encoder.encode([tz.read_text(f)])[0], np.uint32(0))
                           for f in files])
    assert np.array_equal(np.frombuffer(raw[16:], "<u4"), want)


def test_workers_are_other_processes(tmp_path, monkeypatch, one_file_per_batch):
    """--jobs 2 encodes in forked workers, --jobs 1 in this process (each records its pid)."""
    import os
    src = make_corpus(tmp_path, n=4)
    pids = tmp_path / "pids"
    real = cmd_tokenize.encode_batch

    def spy(paths, eot):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(paths, eot)

    monkeypatch.setattr(cmd_tokenize, "encode_batch", spy)
    for jobs, mine in ((1, True), (2, False)):
        pids.write_text("")
        assert tokenize(src, "-o", tmp_path / f"{jobs}.tokens", "--jobs", jobs) == 0
        seen = set(map(int, pids.read_text().split()))
        assert len(pids.read_text().split()) == 6
        assert (seen == {os.getpid()}) if mine else (os.getpid() not in seen and len(seen) <= 2)


def test_default_jobs_is_the_cpu_count():
    import os
    assert cmd_tokenize.parse_jobs(None) == cmd_tokenize.default_jobs() == len(os.sched_getaffinity(0))
    assert cmd_tokenize.parse_jobs("7") == 7


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5", ""])
def test_refuses_bad_jobs(tmp_path, capsys, bad):
    src = make_sources(tmp_path)
    out = tmp_path / "x.tokens"
    refused(capsys, tokenize(src, "-o", out, f"--jobs={bad}"), f"--jobs {bad}", "--jobs 1")
    assert not out.exists()


# an earlier cache at -o (--force replaces only a token cache:
# tests/host/cli/test_replace_only_own.py)
OLD_CACHE = tk.header_bytes(1, 1) + np.arange(7, dtype="<u4").tobytes()


def test_worker_refusal_keeps_old_cache_and_no_temporary(tmp_path, capsys, one_file_per_batch):
    """A NUL file in a late batch, found by a worker: refused like in-process, the old cache
    untouched, no temporary file left."""
    src = make_corpus(tmp_path)
    (src / "zz.bin").write_bytes(b"text\0more")
    out = tmp_path / "c.tokens"
    out.write_bytes(OLD_CACHE)
    refused(capsys, tokenize(src, "-o", out, "--force", "--jobs", 2), "zz.bin", "NUL bytes")
    assert out.read_bytes() == OLD_CACHE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.tokens", "corpus"]


def test_interrupt_mid_write_keeps_old_cache(tmp_path, monkeypatch, capsys, one_file_per_batch):
    src = make_corpus(tmp_path, n=3)
    out = tmp_path / "c.tokens"
    out.write_bytes(OLD_CACHE)
    real, calls = cmd_tokenize.encode_batch, []

    def interrupted(paths, eot):
        calls.append(paths)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(paths, eot)

    monkeypatch.setattr(cmd_tokenize, "encode_batch", interrupted)
    assert tokenize(src, "-o", out, "--force", "--jobs", 1) == 130
    assert out.read_bytes() == OLD_CACHE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.tokens", "corpus"]


def test_progress_bar_only_on_request_or_terminal(tmp_path, capsys):
    src = make_sources(tmp_path)
    assert tokenize(src, "-o", tmp_path / "a.tokens") == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err, err       # not a terminal: the summary only
    assert tokenize(src, "-o", tmp_path / "b.tokens", "--progress") == 0
    err = capsys.readouterr().err
    assert "\x1b[" in err and "tokenize" in err and "MB" in err, err
    assert (tmp_path / "a.tokens").read_bytes() == (tmp_path / "b.tokens").read_bytes()


def test_encode_joined_is_encode_with_separators(encoder):
    texts = ["", "def f():\n    pass\n", "x <|endoftext|> y", "", " é\t\n"]
    for batch in (texts, texts[:2], [texts[2]], [], [""]):
        want = [p for a in encoder.encode(batch) for p in (a, np.array([7], np.uint32))]
        want = np.concatenate(want) if want else np.zeros(0, np.uint32)
        got = encoder.encode_joined(batch, 7)
        assert got.dtype == np.uint32 and np.array_equal(got, want), batch
        assert np.array_equal(encoder.encode_joined(batch, None), want[want != 7])


def test_refuses_a_source_as_cache_under_any_name(tmp_path, capsys):
    src = make_sources(tmp_path)
    (tmp_path / "link").symlink_to(src)
    before = (src / "a.py").read_bytes()
    for out in (src / "a.py", tmp_path / "link" / "a.py"):
        refused(capsys, tokenize(src, "-o", out, "--force"), "is one of the sources")
    assert (src / "a.py").read_bytes() == before


def test_spawned_workers_load_their_own_encoder(tmp_path, monkeypatch, capsys, one_file_per_batch):
    """Where fork is missing (macOS, Windows default to spawn), workers load the tokenizer
    themselves: the same bytes."""
    monkeypatch.setattr(cmd_tokenize, "START_METHOD", "spawn")
    src = make_corpus(tmp_path, n=3)
    assert tokenize(src, "-o", tmp_path / "s.tokens", "--jobs", 2) == 0
    assert tokenize(src, "-o", tmp_path / "i.tokens", "--jobs", 1) == 0
    assert "2 job(s)" in capsys.readouterr().err
    assert (tmp_path / "s.tokens").read_bytes() == (tmp_path / "i.tokens").read_bytes()
