"""plan/launches/regions.py against the kernels themselves: every launch of the tiny profile's forward
and first update, run alone on the interpret backend, twice from the same state — once as it is,
once with every byte outside its declared reads poisoned (device buffers and staging alike):

  * the bytes the poisoned run changes lie inside its declared writes;
  * each declared write is written, at least partly (a `partial` region may not be: the data
    decides, e.g. E's rows between embed_decay and embed_grad);
  * inside its declared writes it writes what the unpoisoned run wrote: its declared reads are
    everything it reads (a volatile device time apart).

Forward then update, each launch continuing from the unpoisoned run's state (~40 s on 2 cores).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.support.digest_support import FORWARD_SEQUENCE, PROFILE, UPDATE_SEQUENCE, before_forward

from coppelius.plan.launches import regions as LR
from coppelius.staging import layout as L

# every fp32/bf16 word ~1.5e16 and every id out of range: finite, so that what a kernel computes
# from it differs from it (a NaN poison would pass through arithmetic with its bits unchanged)
POISON = 0x5A


def _state(be) -> dict[str, np.ndarray]:
    out = {name: t.view(-1).view(torch.uint8).numpy().copy() for name, t in be.buffers.items()}
    out[LR.STAGING] = be.staging.raw.copy()
    return out


def _load(be, state: dict[str, np.ndarray]) -> None:
    for name, t in be.buffers.items():
        t.view(-1).view(torch.uint8).copy_(torch.from_numpy(state[name]))
    be.staging.raw[:] = state[LR.STAGING]


def _mask(state: dict, regions) -> dict[str, np.ndarray]:
    """Per space, the bytes the regions cover."""
    out = {s: np.zeros(a.size, bool) for s, a in state.items()}
    for r in regions:
        size = r.itemsize
        for k in range(r.repeat):
            start = (r.offset + k * r.stride) * size
            out[r.space][start:start + r.run * size] = True
    return out


def _covered(changed: dict, r) -> bool:
    m = _mask({r.space: changed[r.space]}, [r])[r.space]
    return bool((changed[r.space] & m).any())


def check_launch(be, submission: int, index: int) -> list[str]:
    """The three checks of the module docstring for one launch; leaves the unpoisoned result."""
    launch = be.plan_submission(submission).launches[index]
    regs = LR.regions(PROFILE, launch)
    before = _state(be)
    be.run_launch(submission, index)
    real = _state(be)
    reads, writes = _mask(before, regs.reads), _mask(before, regs.writes)
    volatile = _mask(before, [r for r in regs.writes if r.volatile])
    poisoned = {s: np.where(reads[s], a, np.uint8(POISON)) for s, a in before.items()}
    _load(be, poisoned)
    be.run_launch(submission, index)
    after = _state(be)
    problems, changed = [], {}
    for s in before:
        changed[s] = after[s] != poisoned[s]
        outside = np.flatnonzero(changed[s] & ~writes[s])
        if outside.size:
            problems.append(f"{launch.label} writes {s} byte {outside[0]} ({outside.size} bytes) "
                            "outside its declared writes")
        wrong = np.flatnonzero(changed[s] & writes[s] & ~volatile[s] & (after[s] != real[s]))
        if wrong.size:
            problems.append(f"{launch.label}: {s} byte {wrong[0]} depends on a byte outside its "
                            f"declared reads ({wrong.size} bytes)")
    problems += [f"{launch.label} never writes its declared {r.name}" for r in regs.writes
                 if not r.partial and not _covered(changed, r)]
    _load(be, real)
    return problems


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return before_forward(tmp_path_factory.mktemp("regions") / "stream")


def test_every_forward_and_update_launch_touches_what_it_declares(backend):
    problems = []
    for submission in (L.SUBMISSION_FORWARD, L.SUBMISSION_UPDATE):
        if submission == L.SUBMISSION_UPDATE:
            backend.staging.doorbell[0] = UPDATE_SEQUENCE
        for i in range(len(backend.plan_submission(submission).launches)):
            problems += check_launch(backend, submission, i)
    assert not problems, "\n".join(problems[:20])


def test_the_check_catches_an_undeclared_read_and_write(backend, monkeypatch):
    """A rule that forgets a read (residual_norm's partials) or a write (its rstd) is caught."""
    sub = backend.plan_submission(L.SUBMISSION_UPDATE)
    i = next(k for k, x in enumerate(sub.launches) if x.function == "residual_norm")
    real = LR.RULES["residual_norm"]

    def forgetful(s, x):
        reads, writes = real(s, x)
        return ([r for r in reads if r.name != "part_ptr"],
                [r for r in writes if r.name != "rstd_ptr"])

    monkeypatch.setitem(LR.RULES, "residual_norm", forgetful)
    backend.staging.doorbell[0] = FORWARD_SEQUENCE
    backend.issue(L.SUBMISSION_FORWARD)          # real partials to read, whatever ran before
    saved = _state(backend)
    try:
        found = check_launch(backend, L.SUBMISSION_UPDATE, i)
    finally:
        _load(backend, saved)
    assert any("outside its declared writes" in p for p in found), found
    assert any("outside its declared reads" in p for p in found), found
