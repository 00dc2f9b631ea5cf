"""`inspect --plot` — loss, device time and host gap on shared step axes,
publications and the run's end marked; tested by rendering (artists and the PNG's pixels)."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from coppelius import cli
from coppelius.backends.cuda import ptx
from coppelius.cli import inspect as I
from coppelius import levels as LV
from coppelius.results import reader as RF
from coppelius.plan import profiles as P
from coppelius.staging import records as R
from coppelius.staging import synthetic

from tests.support.result_synth import synthesize

matplotlib = pytest.importorskip("matplotlib")
from matplotlib import colors as mcolors          # noqa: E402
from matplotlib import image as mimage            # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg   # noqa: E402

from coppelius.forensics import plot as PL  # noqa: E402

TINY, PROD = P.get("tiny"), P.get("coppelius")
SERIES = {"loss": "tab:blue", "device": "tab:green", "gap": "tab:orange"}
COLOUR_TOL = 12          # per channel, 0..255: antialiasing leaves a line's core at its colour
MIN_SERIES_PIXELS = 40   # a drawn series covers at least this many pixels of its colour


def _file(tmp_path, profile=TINY, name=None, **kw):
    path = tmp_path / (name or f"{profile.name}-{kw.get('outcome', 0)}-{kw.get('steps')}.bin")
    synthesize(profile, **kw).write(path, overwrite=True)
    return RF.read(path)


def _levels(rf):
    return LV.RunLevels.of_run(rf.profile, int(rf.status["c0"]), rf.steps)


def _lines(ax):
    """Data lines of an axes (not the vertical marks, whose x data is two equal values, nor
    single-point markers)."""
    return [ln for ln in ax.get_lines() if len(set(np.asarray(ln.get_xdata(), float))) > 1]


def _vlines(ax, colour):
    want = mcolors.to_rgba(colour)
    return sorted(float(ln.get_xdata()[0]) for ln in ax.get_lines()
                  if list(ln.get_ydata()) == [0, 1] and len(set(ln.get_xdata())) == 1
                  and mcolors.to_rgba(ln.get_color()) == want)


def _render(fig, path):
    """Save as the command does; read the PNG back; each axes' pixel box (rows top-down)."""
    fig.savefig(path, dpi=PL.DPI)
    img = mimage.imread(path)                                       # (H, W, 4) floats 0..1
    FigureCanvasAgg(fig).draw()
    h = img.shape[0]
    boxes = []
    for ax in fig.axes:
        bb = ax.get_window_extent()
        boxes.append((int(h - bb.y1) + 2, int(h - bb.y0) - 2, int(bb.x0) + 2, int(bb.x1) - 2))
    return img, boxes


def _pixels_of(img, box, colour) -> int:
    r0, r1, c0, c1 = box
    rgb = (img[r0:r1, c0:c1, :3] * 255).astype(np.int16)
    want = (np.array(mcolors.to_rgb(colour)) * 255).astype(np.int16)
    return int((np.abs(rgb - want) <= COLOUR_TOL).all(axis=-1).sum())


@pytest.mark.parametrize("outcome", sorted(R.OUTCOMES))
def test_panels_hold_the_files_series_and_marks(tmp_path, outcome):
    rf = _file(tmp_path, outcome=outcome, seed=outcome + 3, c0=100 * outcome)
    levels = _levels(rf)
    fig = PL.figure(rf, levels)
    ax_loss, ax_dev, ax_gap = fig.axes
    assert ax_dev.get_shared_x_axes().joined(ax_loss, ax_gap)
    (loss,) = [ln for ln in _lines(ax_loss) if ln.get_label() == "loss per step"]
    np.testing.assert_array_equal(loss.get_ydata(), rf.step_losses())
    (dev,) = _lines(ax_dev)
    np.testing.assert_array_equal(dev.get_xdata(), rf.update_steps())
    np.testing.assert_array_equal(dev.get_ydata(), rf.device_step_ns() / 1e6)
    (gap,) = _lines(ax_gap)
    steps, gap_ns = rf.update_gaps()
    np.testing.assert_array_equal(gap.get_xdata(), steps)
    np.testing.assert_array_equal(gap.get_ydata(), gap_ns / 1e3)
    # gap before update s = its issue − the previous issue's fence
    ts = rf.timestamps
    k = int(np.flatnonzero(ts["submission"] == 1)[0])
    assert gap_ns[0] == int(ts["host_issue_ns"][k]) - int(ts["host_fence_ns"][k - 1])
    # the floor of each step's context c0 + s (thin), its running mean (dashed), the no-copy level
    floor = synthetic.context_floor(rf.profile, int(rf.status["c0"]) + np.arange(rf.steps))
    by_label = {ln.get_label().split(":")[0]: ln for ln in _lines(ax_loss)}
    if rf.steps > 1:
        np.testing.assert_array_equal(by_label["floor of each step's context"].get_ydata(), floor)
        dashed = by_label[f"floor, mean of the last ≤ {PL.SMOOTH_STEPS} steps"]
        assert dashed.get_linestyle() == "--"
        np.testing.assert_allclose(dashed.get_ydata(),
                                   [floor[:i + 1].mean() for i in range(rf.steps)], atol=1e-12)
        no_copy = by_label["no-copy level (chain learned, copying not), same mean"].get_ydata()
        np.testing.assert_allclose(no_copy, LV.trailing_mean(levels.no_copy), atol=1e-12)
        assert (no_copy > dashed.get_ydata()).all()
        w = levels.window(rf.step_losses())
        assert f"{w.over_floor:+.4f} over their floor {w.floor:.4f}" in ax_loss.get_title("left")
    want_pubs = [s + 0.5 for s in rf.publication_steps()]
    for ax in fig.axes:
        assert _vlines(ax, PL.PUBLICATION_COLOUR) == want_pubs
        stop = _vlines(ax, PL.STOP_COLOUR)
        if outcome == R.OUTCOME_COMPLETED:
            assert stop == []
        elif outcome == R.OUTCOME_INTERRUPTED:
            assert stop == [rf.steps - 0.5]
        else:
            assert stop == [rf.steps]
    texts = " ".join(t.get_text() for t in ax_loss.texts)
    if outcome != R.OUTCOME_COMPLETED:
        assert rf.outcome in texts
        assert bytes(rf.error_notifier["reason"]).rstrip(b"\0").decode() in texts


def test_publications_follow_the_interval_and_the_interruption():
    """host/run/loop.py's rule on synthetic status blocks (the fake-driver test below checks it
    against the run loop itself)."""
    prof = PROD
    rf = RF.ResultFile.__new__(RF.ResultFile)
    for outcome, done, want in [(R.OUTCOME_COMPLETED, 10_000, list(range(999, 10_000, 1000))),
                                (R.OUTCOME_INTERRUPTED, 2500, [999, 1999, 2499]),
                                (R.OUTCOME_INTERRUPTED, 3000, [999, 1999, 2999]),
                                (R.OUTCOME_DEVICE_ERROR, 2500, [999, 1999]),
                                (R.OUTCOME_INTERRUPTED, 0, [])]:
        st = np.zeros((), R.STATUS_BLOCK.dtype)
        st["outcome"], st["steps_planned"] = outcome, 10_000
        rf.status, rf.steps, rf.profile = st, done, prof
        assert rf.publication_steps().tolist() == want, (outcome, done)
    st["steps_planned"] = 2500                     # --steps 2500: the last planned step publishes
    rf.status, rf.steps = st, 2500
    st["outcome"] = R.OUTCOME_COMPLETED
    assert rf.publication_steps().tolist() == [999, 1999, 2499]


@pytest.mark.parametrize("profile,outcome,steps", [(TINY, R.OUTCOME_DEVICE_ERROR, 5),
                                                   (PROD, R.OUTCOME_INTERRUPTED, 2345)])
def test_png_shows_every_series_in_its_own_panel(tmp_path, profile, outcome, steps):
    rf = _file(tmp_path, profile, outcome=outcome, steps=steps, seed=11)
    fig = PL.figure(rf, _levels(rf))
    img, boxes = _render(fig, tmp_path / "p.png")
    w, h = PL.FIGSIZE
    assert img.shape == (round(h * PL.DPI), round(w * PL.DPI), 4)
    for (name, colour), box in zip(SERIES.items(), boxes):
        r0, r1, c0, c1 = box
        assert img[r0:r1, c0:c1, :3].std() > 0.05, f"{name} panel is blank"
        assert _pixels_of(img, box, colour) >= MIN_SERIES_PIXELS, f"{name} series not drawn"
        for other, oc in SERIES.items():       # no series leaks into another's panel
            if other != name:
                assert _pixels_of(img, box, oc) < MIN_SERIES_PIXELS, (other, "in", name)
        assert _pixels_of(img, box, PL.STOP_COLOUR) >= MIN_SERIES_PIXELS, f"no stop in {name}"
        assert _pixels_of(img, box, PL.PUBLICATION_COLOUR) > 0, f"no publication in {name}"
    # the floor and the no-copy level are drawn, in the loss panel only
    for colour in (PL.FLOOR_COLOUR, PL.NO_COPY_COLOUR):
        assert _pixels_of(img, boxes[0], colour) >= MIN_SERIES_PIXELS, colour
        for box in boxes[1:]:
            assert _pixels_of(img, box, colour) < MIN_SERIES_PIXELS, colour


def test_a_run_without_steps_says_so_and_draws_no_series(tmp_path):
    rf = _file(tmp_path, outcome=R.OUTCOME_HOST_ERROR, steps=0)
    fig = PL.figure(rf)
    assert all(not _lines(ax) for ax in fig.axes)
    assert "no completed steps" in [t.get_text() for t in fig.axes[0].texts]
    img, boxes = _render(fig, tmp_path / "empty.png")
    for (name, colour), box in zip(SERIES.items(), boxes):
        assert _pixels_of(img, box, colour) == 0, name
    assert _pixels_of(img, boxes[0], PL.STOP_COLOUR) >= MIN_SERIES_PIXELS


def test_non_finite_steps_are_marked(tmp_path):
    syn = synthesize(TINY, seed=2)
    syn.windows[3, 7] = np.nan
    syn.write(tmp_path / "nan.bin")
    fig = PL.figure(RF.read(tmp_path / "nan.bin"))
    (marks,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("non-finite")]
    assert marks.get_xdata().tolist() == [3]


def test_a_failed_publication_is_drawn_as_not_completed(tmp_path):
    syn = synthesize(TINY, seed=5)
    st = np.frombuffer(syn.status, R.STATUS_BLOCK.dtype).copy()
    st["publications"] = 1                         # of 2 started: the second failed
    syn.status = st.tobytes()
    syn.write(tmp_path / "f.bin")
    fig = PL.figure(RF.read(tmp_path / "f.bin"))
    dashdot = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "-."]
    assert [float(ln.get_xdata()[0]) for ln in dashdot] == [7.5]
    assert "publication not completed" in [t.get_text() for t in fig.axes[0].get_legend().texts]


# ---- the command: which stream, the JSON, the PNG ----------------------------------------------

def _default_layout(tmp_path, profile=TINY):
    """What `coppelius run` leaves: the stream (here a sparse file of its exact size) beside the
    default-named result."""
    d = tmp_path / "coppelius-run"
    d.mkdir()
    with open(d / f"{profile.name}{synthetic.STREAM_SUFFIX}", "wb") as f:
        f.truncate(synthetic.stream_bytes(profile))
    result = d / f"{profile.name}-result-c0.bin"
    synthesize(profile, seed=1).write(result)
    return result


def _json(capsys, *argv):
    assert cli.main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_stream_auto_detects_the_default_layout_only(tmp_path, capsys):
    result = _default_layout(tmp_path)
    info = _json(capsys, str(result))
    assert info["stream"]["embedded"] and info["floor"]["mean_floor"] == pytest.approx(
        synthetic.context_floor(TINY, np.arange(TINY.steps)).mean())
    assert info["publication_steps"] == [3, 7]
    assert not _json(capsys, str(result), "--stream", "none")["stream"]["embedded"]
    renamed = result.with_name("mine.bin")
    result.rename(renamed)                         # a named result: auto cannot tell
    info = _json(capsys, str(renamed))
    assert not info["stream"]["embedded"] and info["floor"] is None
    assert "--stream embedded" in info["stream"]["basis"]
    assert _json(capsys, str(renamed), "--stream", "embedded")["floor"] is not None
    renamed.rename(result)                         # a stream file of another size is not it
    stream = result.parent / f"tiny{synthetic.STREAM_SUFFIX}"
    os.truncate(stream, 4096)
    assert not _json(capsys, str(result))["stream"]["embedded"]


def test_inspect_plot_draws_the_floor_of_the_embedded_stream_only(tmp_path, capsys, monkeypatch):
    result = _default_layout(tmp_path)
    drawn = []
    real = PL.figure
    monkeypatch.setattr(PL, "figure",
                        lambda rf, levels=None: drawn.append(levels) or real(rf, levels))
    png = tmp_path / "p.png"
    assert cli.main(["inspect", str(result), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"plot written to {png}" in out and "the embedded stream (auto" in out
    assert "publications started at update 4, 8: 2 of 2 completed" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mimage.imread(png).shape[:2] == (round(PL.FIGSIZE[1] * PL.DPI),
                                             round(PL.FIGSIZE[0] * PL.DPI))
    assert cli.main(["inspect", str(result), "--plot", str(png), "--stream", "none"]) == 0
    assert drawn[1] is None and drawn[0].c0 == 0
    np.testing.assert_array_equal(drawn[0].floor, synthetic.context_floor(TINY, np.arange(8)))


# ---- the publication rule against the run loop itself (fake driver) ----------------------------

class _Recorder:
    """Progress that records publications and can interrupt the run at one step."""

    def __init__(self, interrupt_at=None):
        self.published_counts, self.at = [], interrupt_at

    def start(self, *a): ...
    def note(self, *a): ...
    def stop(self): ...

    def step(self, step, loss, *rest):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGINT)    # the run loop's handler: finish, publish, stop

    def published(self, update_count, seconds):
        self.published_counts.append(update_count)


@pytest.mark.skipif(not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(),
                    reason="kernels_ptx not built")
@pytest.mark.parametrize("interrupt_at", [None, 1, 3])
def test_publication_steps_are_the_run_loops(tmp_path, monkeypatch, interrupt_at):
    from tools.fake_driver import FakeDriver
    from coppelius.driver import calls as drv
    from coppelius.run.loop import Request, run
    from coppelius.staging.views import StagingViews
    monkeypatch.setattr(drv, "_cu", FakeDriver())
    # the fake device runs only the releases: its records keep their markers
    monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    (tmp_path / "c.ckpt").write_bytes(b"")
    rec = _Recorder(interrupt_at)
    summary = run(Request(profile=TINY, checkpoint=tmp_path / "c.ckpt", result=tmp_path / "r.bin",
                          backend="cuda", directory=tmp_path / "run"), rec)
    rf = RF.read(tmp_path / "r.bin")
    assert rf.outcome_code == (R.OUTCOME_COMPLETED if interrupt_at is None
                               else R.OUTCOME_INTERRUPTED), summary.error
    assert (rf.publication_steps() + 1).tolist() == rec.published_counts
    assert int(rf.status["publications"]) == len(rec.published_counts)
    assert not [w for w in rf.warnings() if "publications" in w]
    fig = PL.figure(rf)
    assert _vlines(fig.axes[0], PL.PUBLICATION_COLOUR) == [s + 0.5 for s in rf.publication_steps()]
