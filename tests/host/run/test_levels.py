"""The floor on the host: each step's context floor and no-copy level, the window of
loss − floor the progress line and `inspect` show, and no floor for a run on a `--tokens` cache."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from coppelius import cli
from coppelius.backends.cuda import ptx
from coppelius.forensics import summary as SU
from coppelius import levels as LV
from coppelius.results import reader as RF
from coppelius.cli.run import loss_text
from coppelius.plan import profiles as P
from coppelius.staging import synthetic

from tests.support.result_synth import synthesize

TINY, PROD = P.get("tiny"), P.get("coppelius")


def test_step_s_reads_context_c0_plus_s():
    lv = LV.RunLevels.of_run(PROD, 9_990, 30)
    for s in (0, 1, 17, 29):
        assert lv.floor[s] == synthetic.context_floor(PROD, 9_990 + s)[0]
        assert lv.no_copy[s] == synthetic.context_no_copy(PROD, 9_990 + s)[0]
    assert len(set(lv.floor.tolist())) > 1          # per context, not one constant
    assert (lv.no_copy > lv.floor).all()
    # the stream's last context is the last with a floor
    assert LV.RunLevels.of_run(PROD, synthetic.CONTEXTS - 3, 3).steps == 3
    assert LV.RunLevels.of_run(PROD, synthetic.CONTEXTS - 3, 4) is None
    assert LV.RunLevels.of_run(PROD, -1, 4) is None


def _hand_window(losses, floor, no_copy, window):
    """The window's means by a plain loop: what the display must equal."""
    done = len(losses)
    first = max(0, done - window)
    n = done - first
    over = sum(losses[s] - floor[s] for s in range(first, done)) / n
    return (sum(losses[first:done]) / n, sum(floor[first:done]) / n, over,
            sum(no_copy[first:done]) / n, first, n)


@pytest.mark.parametrize("done", [1, 37, LV.WINDOW, LV.WINDOW + 1, 253])
def test_window_mean_of_loss_minus_floor_is_the_hand_computation(done):
    c0, steps = 4_321, 300
    lv = LV.RunLevels.of_run(PROD, c0, steps)
    rng = np.random.default_rng(done)
    # a synthetic loss table: each step above its own context's floor by a known, varying amount
    over = 0.05 + 0.4 * rng.random(steps)                                  # (steps,)
    losses = (lv.floor + over).tolist()[:done]
    loss, floor, want_over, no_copy, first, n = _hand_window(
        losses, lv.floor.tolist(), lv.no_copy.tolist(), LV.WINDOW)
    w = lv.window(losses)
    assert (w.first, w.steps) == (first, n)
    assert w.loss == pytest.approx(loss, abs=1e-12)
    assert w.floor == pytest.approx(floor, abs=1e-12)
    assert w.over_floor == pytest.approx(want_over, abs=1e-12)
    assert w.over_floor == pytest.approx(over[first:done].mean(), abs=1e-12)
    assert w.no_copy == pytest.approx(no_copy, abs=1e-12)
    text = loss_text(losses, lv)
    assert text == (f"loss {loss:.4f} · floor {floor:.4f} (window {n}) · "
                    f"{want_over:+.4f} over floor · no-copy {no_copy:.4f}")


def test_window_refuses_more_losses_than_steps_and_is_none_before_the_first():
    lv = LV.RunLevels.of_run(TINY, 0, 8)
    assert lv.window([]) is None and loss_text([], lv) == "loss —"
    with pytest.raises(ValueError, match="9 losses for a run of 8"):
        lv.window([1.0] * 9)


def test_without_levels_the_line_shows_no_floor():
    losses = [3.0, 2.0, 1.0]
    assert loss_text(losses, None) == "loss 2.0000 (mean of 3)"
    assert "floor" not in loss_text(losses, None) and loss_text([], None) == "loss —"


@pytest.mark.parametrize("n,window", [(1, 100), (5, 3), (250, 100), (7, 7)])
def test_trailing_mean_is_the_loop(n, window):
    v = np.random.default_rng(n).random(n)
    want = [v[max(0, i - window + 1):i + 1].mean() for i in range(n)]
    np.testing.assert_allclose(LV.trailing_mean(v, window), want, rtol=0, atol=1e-12)


def test_trailing_mean_keeps_a_nan_inside_its_windows():
    v = np.ones(20)
    v[5] = np.nan
    m = LV.trailing_mean(v, 4)
    assert np.isnan(m[5:9]).all() and np.isfinite(m[:5]).all() and (m[9:] == 1).all()


# ---- inspect: the last window against the floor ----------------------------------------------

def _embedded_result(tmp_path, c0=1_234, steps=150, over=0.25):
    """A result file whose loss rows are its contexts' row entropies + `over`: each step's loss
    is its context's floor + over exactly (up to f32), the copy rows' loss is `over`."""
    profile = PROD
    syn = synthesize(profile, c0=c0, steps=steps)   # its windows are replaced below
    contexts = c0 + np.arange(steps)
    rows = synthetic.row_entropy(profile, contexts) + over                   # (steps, T)
    syn.windows[:] = rows.astype("<f4")
    path = tmp_path / "named-result.bin"
    syn.write(path)
    return path, profile, contexts


def test_inspect_shows_the_last_window_against_its_floor(tmp_path, capsys):
    path, profile, contexts = _embedded_result(tmp_path)
    assert cli.main(["inspect", str(path), "--json", "--stream", "embedded"]) == 0
    fl = json.loads(capsys.readouterr().out)["floor"]
    last = contexts[-LV.WINDOW:]
    rows = (synthetic.row_entropy(profile, last) + 0.25).astype(np.float32)   # as stored
    assert fl["window"] == LV.WINDOW and fl["steps"] == LV.WINDOW
    assert fl["first_step"] == len(contexts) - LV.WINDOW
    floor, no_copy = (synthetic.context_floor(profile, last).mean(),
                      synthetic.context_no_copy(profile, last).mean())
    assert fl["mean_floor"] == pytest.approx(floor, abs=1e-12)
    assert fl["mean_loss"] == pytest.approx(rows.mean(axis=1, dtype=np.float64).mean(), abs=1e-12)
    assert fl["loss_minus_floor"] == pytest.approx(0.25, abs=1e-6)
    assert fl["no_copy"] == pytest.approx(no_copy, abs=1e-12)
    assert fl["copy_block_loss"] == pytest.approx(0.25, abs=1e-6)   # copy rows' floor is 0
    assert fl["stream_floor"] == pytest.approx(synthetic.loss_floor(profile))
    assert fl["stream_no_copy"] == pytest.approx(synthetic.no_copy_level(profile))
    assert cli.main(["inspect", str(path), "--stream", "embedded"]) == 0
    out = capsys.readouterr().out
    assert f"steps {fl['first_step']:,}–{len(contexts) - 1:,}" in out
    assert "+0.2500" in out and f"{fl['no_copy']:.4f}" in out and "copy-block loss" in out


def test_a_tokens_run_shows_no_floor(tmp_path, capsys):
    path, _, _ = _embedded_result(tmp_path, steps=20)
    for argv in ([], ["--stream", "none"]):      # a named result: auto cannot tell; none: not it
        assert cli.main(["inspect", str(path), "--json", *argv]) == 0
        assert json.loads(capsys.readouterr().out)["floor"] is None
        assert cli.main(["inspect", str(path), *argv]) == 0
        out = capsys.readouterr().out
        assert "floor" not in out and "no-copy" not in out


def test_a_c0_past_the_stream_has_no_floor(tmp_path, capsys):
    syn = synthesize(TINY, c0=synthetic.CONTEXTS - 2)     # 8 steps: contexts past the stream
    syn.write(tmp_path / "late.bin")
    assert SU.run_levels(RF.read(tmp_path / "late.bin"), {"embedded": True}) is None


# ---- the run loop hands the progress display this run's levels (fake driver) -----------------

class _Capture:
    def __init__(self):
        self.levels, self.texts = [], []

    def start(self, summary, levels, tokens_per_step):
        self.levels.append(levels)
        self.summary = summary

    def step(self, step, loss):
        self.texts.append(loss_text(self.summary.losses, self.levels[-1]))

    def published(self, *a): ...
    def note(self, *a): ...
    def stop(self): ...


@pytest.mark.skipif(not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(),
                    reason="kernels_ptx not built")
def test_the_run_passes_the_embedded_streams_levels_and_none_for_tokens(tmp_path, monkeypatch):
    from tools.fake_driver import FakeDriver
    from coppelius.driver import calls as drv
    from coppelius.run.loop import Request, run
    from coppelius.staging.views import StagingViews
    monkeypatch.setattr(drv, "_cu", FakeDriver())
    monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    (tmp_path / "c.ckpt").write_bytes(b"")
    cap = _Capture()
    run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "a.bin",
                backend="cuda", directory=tmp_path / "run"), cap)
    (lv,) = cap.levels
    assert lv.c0 == 0 and lv.steps == TINY.steps
    np.testing.assert_array_equal(lv.floor, synthetic.context_floor(TINY, np.arange(TINY.steps)))
    assert len(cap.texts) == TINY.steps and all("over floor" in t for t in cap.texts)
    # the same ids given as a --tokens cache: the host cannot know their floor
    cache = tmp_path / "copy.tokens"
    shutil.copyfile(tmp_path / "run" / f"tiny{synthetic.STREAM_SUFFIX}", cache)
    (tmp_path / "d.ckpt").write_bytes(b"")
    cap = _Capture()
    run(Request(profile=TINY, tokens=cache, checkpoint=tmp_path / "d.ckpt",
                result=tmp_path / "b.bin", backend="cuda"), cap)
    assert cap.levels == [None] and not any("floor" in t for t in cap.texts)
    assert math.isfinite(float(cap.texts[-1].split()[1]))


def test_the_rich_bar_renders_the_window_from_the_runs_losses():
    """The bar's loss column is computed when it renders, from summary.losses: its last frame
    shows the whole run's window."""
    import io

    from rich.console import Console

    from coppelius.cli.run import RichProgress
    from coppelius.run.records import Summary
    lv = LV.RunLevels.of_run(TINY, 0, TINY.steps)
    summary = Summary(steps_planned=TINY.steps)
    prog = RichProgress()
    out = io.StringIO()
    prog.console = Console(file=out, width=300, force_terminal=False)
    prog.start(summary, lv, TINY.context)
    for s in range(TINY.steps):
        summary.losses.append(float(lv.floor[s]) + 0.5)
        prog.step(s, summary.losses[-1])
    prog.stop()
    text = out.getvalue()
    assert f"floor {lv.floor.mean():.4f} nats/token over this run's contexts" in text
    assert loss_text(summary.losses, lv) in text and "+0.5000 over floor" in text
