"""The whole launch lists of the tiny profile executed by the interpret backend reproduce the
reference model: forward (record, predictions), update (loss rows, w0, w1, gradients, P/M/V after
AdamW), final (record, predictions, w2, w3); the launch lists are data without Triton.

The update keeps no gradient plane (AdamW runs in the weight-gradient epilogues and in
embed_grad), so the gradients are read back from the first moment: at t = 1 from M = V = 0,
M = fp32((1 − β1)·g) exactly; where the kernels keep g (w1: E's first words; dgain: the gains)
M, V and P are checked against the reference learner on that very g."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from tests.support.backend_support import download_payload
from tests.support.kernels_support import assert_close
from tests.support.tolerances import ADAMW_ON_KERNEL_GRAD, GRADIENT, LOGITS, LOSS_ROWS

from coppelius.backends.interpret import InterpretBackend
from coppelius.plan import launches, profiles
from coppelius.plan import reference as ref
from coppelius.staging import layout as L

PROFILE = profiles.get("tiny")
T_BASE = -1                       # fresh run: c0 = 0


def _tokens():
    rng = np.random.default_rng(2026)
    ids = rng.integers(0, PROFILE.vocab, PROFILE.context + 1)
    ids[300:420] = ids[10:130]                                   # repeats: the dE chains
    return ids


def _issue(be, submission, seq):
    be.staging.doorbell[0] = seq
    be.issue(submission)
    slot = be.staging.semaphores[submission]
    return slot


@pytest.fixture(scope="module")
def run():
    ids = _tokens()
    P = ref.init_parameters(PROFILE)
    n = PROFILE.parameter_count
    be = InterpretBackend(PROFILE)
    be.staging.inputs[:] = ids[:-1]
    be.staging.targets[:] = ids[1:]
    be.upload_payload(np.concatenate([P, np.zeros(2 * n, np.float32)]).view(np.uint8))
    be.instantiate(T_BASE)
    be.staging.write_marker(L.record_forward_offset(PROFILE))
    be.staging.write_marker(L.record_final_offset(PROFILE))
    out = {"ids": ids, "P": P}
    out["forward_slot"] = _issue(be, L.SUBMISSION_FORWARD, 1).copy()
    out["record_forward"] = be.staging.record_forward.copy()
    out["pred_forward"] = be.staging.predictions.copy()
    out["update_slot"] = _issue(be, L.SUBMISSION_UPDATE, 2).copy()
    out["loss_record"] = be.staging.loss_record.copy()
    out["loss_block"] = be.staging.loss_block.copy()
    out["dgain"] = be.buffers["dgain"].numpy().copy()
    out["pmv"] = download_payload(be).view(np.float32)
    out["final_slot"] = _issue(be, L.SUBMISSION_FINAL, 3).copy()
    out["record_final"] = be.staging.record_final.copy()
    out["pred_final"] = be.staging.predictions.copy()
    out["loss_block_final"] = be.staging.loss_block.copy()
    out["backend"] = be
    return out


def test_forward_submission_reproduces_reference(run):
    logits = ref.forward(PROFILE, run["P"], run["ids"][:-1])
    rows = logits[list(profiles.PREDICTION_ROWS)]
    assert_close("record forward part", run["record_forward"], rows, LOGITS)
    assert run["pred_forward"][:, 1].tolist() == [1, 1, 1]
    top2 = np.sort(rows, axis=1)[:, -2:]
    for i in range(3):                      # argmax agrees unless the top two are within tolerance
        if top2[i, 1] - top2[i, 0] > 2 * LOGITS * np.abs(rows).max():
            assert run["pred_forward"][i, 0] == rows[i].argmax()


def test_semaphores_carry_payload_and_ordered_timestamps(run):
    raw = run["backend"].staging.raw
    for sub, seq in ((0, 1), (1, 2), (2, 3)):
        base = L.semaphore_slot(sub)
        fin = raw[base + L.SLOT_FINAL_RELEASE:base + L.SLOT_FINAL_RELEASE + 16]
        pre = raw[base + L.SLOT_PRELAUNCH_RELEASE:base + L.SLOT_PRELAUNCH_RELEASE + 16]
        for rec in (fin, pre):
            assert rec[:4].view("<u4")[0] == seq and rec[4:8].view("<u4")[0] == 0
        assert pre[8:].view("<u8")[0] <= fin[8:].view("<u8")[0] != 0


def test_update_submission_reproduces_the_references(run):
    n = PROFILE.parameter_count
    P = run["P"]
    zeros = np.zeros_like(P)
    ce, G, P2, M2, V2 = ref.update_submission(PROFILE, P, zeros, zeros, 1, run["ids"][:-1],
                                              run["ids"][1:])
    assert_close("loss record", run["loss_record"], ce, LOSS_ROWS)
    assert np.array_equal(run["loss_block"][L.W0_LAST_CE], run["loss_record"]), "w0 != loss record"
    pmv = run["pmv"]
    Pk, Mk, Vk = pmv[:n], pmv[n:2 * n], pmv[2 * n:]
    c = ref.adamw_constants(PROFILE, 1)
    # the kernels' gradient, from M = fp32((1 − β1)·g) (t = 1, M = 0 before): within 2⁻²⁴ of g
    grad = Mk.astype(np.float64) / float(c["one_minus_beta1"])
    for q in PROFILE.parameters:
        assert_close(f"gradient {q.name}", grad[q.offset:q.end], G[q.offset:q.end], GRADIENT)
    # where the kernels keep g: E's first words (w1) and the gains (dgain) — M, V, P are the
    # reference learner's on exactly that g
    w1 = run["loss_block"][L.W1_EMBED_GRAD]
    e = PROFILE.parameter("embed").offset
    kept = {"w1": (np.arange(e, e + L.LOSS_WINDOW_WORDS), w1)}
    for i, name in enumerate(("g_embed", "g_final")):
        q = PROFILE.parameter(name)
        kept[name] = (np.arange(q.offset, q.end), run["dgain"][i])
    for what, (idx, g) in kept.items():
        full = grad.astype(np.float32)
        full[idx] = g
        Pr, Mr, Vr = ref.adamw(PROFILE, P, zeros, zeros, full, 1)
        assert np.array_equal(Mk[idx], Mr[idx]), f"M of {what} is not fp32((1 − β1)·g)"
        assert_close(f"V ({what})", Vk[idx], Vr[idx], ADAMW_ON_KERNEL_GRAD)
        assert_close(f"P ({what})", Pk[idx], Pr[idx], ADAMW_ON_KERNEL_GRAD)
    # everywhere: P follows from the kernels' own M and V (NUMERICS' decay and last line)
    decayed = P * np.where(ref.decay_mask(PROFILE), c["decay"], np.float32(1))
    P_from_mv = decayed - (Mk * c["step_size"]) / (np.sqrt(Vk) / c["bc2_sqrt"] + c["eps"])
    assert_close("P from the kernels' M and V", Pk, P_from_mv, ADAMW_ON_KERNEL_GRAD)
    # and against the reference's update_submission: M and V follow the gradient; the first step
    # moves P by ±lr·sign(g), so P differs where g is within the gradient tolerance of 0 — bounded
    # by 2·lr there
    assert_close("M", Mk, M2, GRADIENT)
    assert_close("V", Vk, V2, 2 * GRADIENT)
    lr = float(PROFILE.learner.lr)
    dp = np.abs(Pk - P2)
    assert dp.max() <= 2 * lr * 1.001, f"P moved by {dp.max()} > 2·lr from update_submission"
    firm = np.abs(G) > 100 * float(PROFILE.learner.epsilon)      # |g| ≫ eps: the step is ±lr·(1 − ε)
    assert dp[firm].max() <= 1e-6, \
        f"P differs from update_submission by {dp[firm].max()} where |g| > 1e-6"


def test_final_submission_reproduces_forward_with_final_parameters(run):
    n = PROFILE.parameter_count
    P_final = run["pmv"][:n]
    logits = ref.forward(PROFILE, P_final, run["ids"][:-1])
    assert_close("record final part", run["record_final"], logits[-1], LOGITS)
    assert run["pred_final"][:, 1].tolist() == [1, 1, 1]
    blk = run["loss_block_final"]
    e = PROFILE.parameter("embed").offset
    assert np.array_equal(blk[L.W2_EMBED_FINAL], P_final[e:e + L.LOSS_WINDOW_WORDS])
    assert np.array_equal(blk[L.W3_EMBED_M_FINAL], run["pmv"][n + e:n + e + L.LOSS_WINDOW_WORDS])
    assert not run["backend"].staging.marker_survived(L.record_final_offset(PROFILE))
    assert not run["backend"].staging.marker_survived(L.record_forward_offset(PROFILE))


def _replay_first_update(run, be):
    """`be` from the run fixture's initial state through its forward and first update."""
    ids = run["ids"]
    be.staging.inputs[:] = ids[:-1]
    be.staging.targets[:] = ids[1:]
    n = PROFILE.parameter_count
    be.upload_payload(np.concatenate([run["P"], np.zeros(2 * n, np.float32)]).view(np.uint8))
    be.instantiate(T_BASE)
    _issue(be, L.SUBMISSION_FORWARD, 1)
    _issue(be, L.SUBMISSION_UPDATE, 2)
    return be


def test_update_is_bitwise_repeatable(run):
    """A second backend from the same state gives the same bytes (no schedule-dependent sums)."""
    be = _replay_first_update(run, InterpretBackend(PROFILE))
    assert np.array_equal(be.staging.loss_record.view(np.uint32), run["loss_record"].view(np.uint32))
    assert np.array_equal(download_payload(be).view(np.uint32), run["pmv"].view(np.uint32))


def test_another_topological_order_gives_the_same_bytes(run):
    """The update's side lane (weight gradients + AdamW) run as late as its edges allow instead
    of right after each fork — another valid order of the same graph, as a GPU running the two
    lanes concurrently may interleave them — leaves the same payload and loss record, bit for
    bit."""
    from coppelius.plan.launches.graph import topological_order
    update = launches.submissions(PROFILE)[L.SUBMISSION_UPDATE]
    early = topological_order(update.launches, update.deps, launches.SIDE_LANE)
    late = topological_order(update.launches, update.deps, launches.MAIN_LANE)
    assert early == list(range(len(update.launches))) and late != early
    be = _replay_first_update(run, InterpretBackend(PROFILE, prefer=launches.MAIN_LANE))
    loss = be.staging.loss_record.view(np.uint32)
    assert np.array_equal(loss, run["loss_record"].view(np.uint32))
    assert np.array_equal(download_payload(be).view(np.uint32), run["pmv"].view(np.uint32))


def test_launch_lists_are_data_without_triton():
    code = ("import sys; from coppelius.plan import profiles, launches\n"
            "for n in profiles.names(): launches.submissions(profiles.get(n)); launches.kernels(profiles.get(n))\n"
            "assert 'triton' not in sys.modules and 'torch' not in sys.modules, 'imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", profiles.names())
def test_launch_lists_shape(name):
    prof = profiles.get(name)
    bufs = launches.buffers(prof)
    assert bufs["pmv"].elements == 3 * prof.parameter_count
    assert bufs["w16"].elements == prof.parameter_count and "grad" not in bufs
    for sub in launches.submissions(prof):
        first, last = sub.launches[0], sub.launches[-1]
        assert (first.function, last.function) == (launches.STAGE_IN, launches.RELEASE)
        assert first.arg("slot_ptr").offset == L.semaphore_slot(sub.index) + L.SLOT_PRELAUNCH_RELEASE
        assert last.arg("slot_ptr").offset == L.semaphore_slot(sub.index) + L.SLOT_FINAL_RELEASE
        for launch in sub.launches:
            for pname, a in launch.args:
                if isinstance(a, launches.BufferRef):
                    assert 0 <= a.offset < bufs[a.buffer].elements, (launch.label, pname)
                elif isinstance(a, launches.StagingRef):
                    assert 0 <= a.offset < L.REGION_BYTES, (launch.label, pname)
    names = [x.function for x in launches.submissions(prof)[1].launches]
    assert "adamw" not in names and names[-2] == "embed_grad"      # AdamW rides in the epilogues
