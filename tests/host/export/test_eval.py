"""`coppelius eval`: the mean per-token loss over contexts of a token cache — the reference's on the
CPU, the forward submission's on a backend (interpret here, cuda where a GPU is lent), the two
within verify's per-step tolerance — and the embedded stream's floor beside it."""
import json

import numpy as np
import pytest

from coppelius import forensics
from coppelius.cli import main
from coppelius.export import evaluate
from coppelius.forensics.tolerances import MEAN_ATOL
from coppelius.plan import profiles as P
from coppelius.plan import reference as ref
from coppelius.staging import synthetic as S
from coppelius.staging.tokens import header_bytes
from tests.support.fake_driver_fixture import fake  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return S.ensure_default_stream(P.get("tiny"), tmp_path_factory.mktemp("stream"))


def _eval(capsys, *args) -> dict:
    assert main(["eval", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_reference_eval_is_the_mean_ce_with_the_floor_beside_it(tiny_checkpoint, stream, capsys):
    path, plane = tiny_checkpoint
    rep = _eval(capsys, str(path), "--tokens", str(stream), "--contexts", "2",
                "--backend", "reference")
    prof = P.get("tiny")
    assert rep["first_context"] == 3 and rep["contexts"] == 2       # the update count: held out
    ids = S.generate(prof)                                           # the stream's ids
    want = []
    for c in (3, 4):
        window = ids[prof.context * c:prof.context * (c + 1) + 1].astype(np.int64)
        want.append(ref.forward_trace(prof, plane, window[:-1], window[1:])["cross_entropy.ce"]
                    .mean(dtype=np.float64))
    assert rep["per_context"] == pytest.approx(want, abs=1e-9)
    assert rep["mean_loss"] == pytest.approx(np.mean(want), abs=1e-9)
    assert rep["embedded_stream"] and rep["mean_floor"] == pytest.approx(
        S.context_floor(prof, [3, 4]).mean())
    assert rep["backend"] == "reference" and rep["tokens_scored"] == 2 * prof.context


def test_text_report_and_a_cache_that_is_not_the_stream_shows_no_floor(tiny_checkpoint, stream,
                                                                       tmp_path, capsys):
    path = str(tiny_checkpoint[0])
    assert main(["eval", path, "--tokens", str(stream), "--contexts", "1", "--first", "0",
                 "--backend", "reference"]) == 0
    out = capsys.readouterr().out
    assert "mean loss" in out and "floor" in out and "contexts 0..0" in out
    other = tmp_path / "other.tokens"
    ids = np.random.default_rng(0).integers(0, P.get("tiny").vocab, 2 * 1024 + 1, np.uint32)
    other.write_bytes(header_bytes(1, 1) + ids.astype("<u4").tobytes())
    rep = _eval(capsys, path, "--tokens", str(other), "--contexts", "1", "--first", "1",
                "--backend", "reference")
    assert not rep["embedded_stream"] and "mean_floor" not in rep


def test_refusals(tiny_checkpoint, stream, capsys):
    path = str(tiny_checkpoint[0])
    for bad, what in ((["--contexts", "0"], "--contexts"),
                      (["--first", str(S.CONTEXTS)], "outside"),
                      (["--contexts", str(S.CONTEXTS)], "--first")):
        assert main(["eval", path, "--tokens", str(stream), "--backend", "reference", *bad]) == 2
        err = capsys.readouterr().err
        assert what in err and "hint:" in err, err


def _device_against_reference(backend, tiny_checkpoint, stream):
    ck = forensics.read_checkpoint(tiny_checkpoint[0])
    dev = evaluate.evaluate(ck, stream, contexts=1, backend=backend)
    cpu = evaluate.evaluate(ck, stream, contexts=1, backend="reference")
    print(f"{backend} {dev['mean_loss']:.7f} vs reference {cpu['mean_loss']:.7f}: "
          f"|Δ| {abs(dev['mean_loss'] - cpu['mean_loss']):.2e} (tolerance {MEAN_ATOL})")
    assert dev["backend"] == backend and cpu["backend"] == "reference"
    assert abs(dev["mean_loss"] - cpu["mean_loss"]) <= MEAN_ATOL


def test_interpret_forward_submission_agrees_with_the_reference(tiny_checkpoint, stream):
    pytest.importorskip("triton", reason="the interpret backend needs Triton (the demo extra)")
    _device_against_reference("interpret", tiny_checkpoint, stream)


@pytest.mark.gpu
def test_cuda_forward_submission_agrees_with_the_reference(tiny_checkpoint, stream):
    from coppelius.errors import BackendUnavailable
    try:
        _device_against_reference("cuda", tiny_checkpoint, stream)
    except BackendUnavailable as e:
        pytest.skip(f"no cuda backend here: {e.message}")


def test_the_cuda_path_on_the_fake_driver(fake, tiny_checkpoint, stream):
    """The cuda path's mechanics (the fake driver computes nothing): the parameters go up, each
    context is staged and its forward issue fenced, and the `logits` buffer comes back as the
    context's (T, V) logits — here the values the test put there before the issue."""
    from coppelius.backends.cuda import ptx
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.staging.tokens import TokenCache

    if not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file():
        pytest.skip("kernels_ptx not built")
    fake()
    prof = P.get("tiny")
    plane = tiny_checkpoint[1]
    cache = TokenCache.open(stream, prof)
    known = np.arange(prof.context * prof.vocab, dtype=np.float32).reshape(prof.context, -1)
    with CudaBackend(prof) as be:
        fwd = evaluate.DeviceForward(be, plane, update_count=3)
        be.write_bytes("logits", 0, known.view(np.uint8).reshape(-1))
        got = fwd.run(cache, 5)
        np.testing.assert_array_equal(got, known)
        np.testing.assert_array_equal(be.staging.inputs, cache.context(5)[0])
        assert fwd.sequence == 1 and int(fwd.final[0]) == 1
        assert be.read_bytes("pmv", 0, plane.nbytes).view(np.float32).tolist() == plane.tolist()
