"""Test helpers for the per-launch digests: a tiny interpret backend in the state a fresh
`coppelius run` on the embedded stream leaves before its first update (P initialized, the forward
issued, context 0 staged, the doorbell at the update's sequence number), and digests documents of
that update replayed launch by launch from it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from coppelius.run import digest_replay as DR
from coppelius.results import digests as DG
from coppelius.backends.interpret import InterpretBackend
from coppelius.plan import profiles
from coppelius.plan import reference as ref
from coppelius.staging import layout as L
from coppelius.staging import synthetic
from coppelius.staging.tokens import TokenCache
from tests.support.paths import GOLDEN

PROFILE = profiles.get("tiny")
T_BASE = -1                     # a fresh run: c0 = 0
FORWARD_SEQUENCE, UPDATE_SEQUENCE = 1, 2
GOLDEN = GOLDEN / "tiny-digests-c0-s0.json"


def before_forward(directory: Path, backend=None):
    """A fresh run's backend just before its forward issue: P drawn, M = V = 0, context 0 (an
    interpret backend, or `backend`, made by the caller)."""
    be = InterpretBackend(PROFILE) if backend is None else backend
    be.upload_payload(ref.init_parameters(PROFILE).view(np.uint8))
    be.instantiate(T_BASE)
    stream = synthetic.ensure_default_stream(PROFILE, directory)
    TokenCache.open(stream, PROFILE).write_input_record(be.staging, 0)
    be.staging.doorbell[0] = FORWARD_SEQUENCE
    return be


def before_update(directory: Path) -> tuple[InterpretBackend, dict]:
    """The backend after the forward issue, and its saved state (digest_replay.save_state)."""
    be = before_forward(directory)
    be.issue(L.SUBMISSION_FORWARD)
    be.staging.doorbell[0] = UPDATE_SEQUENCE
    return be, DR.save_state(be)


def replayed(be, saved: dict, path: Path, perturb=None) -> dict:
    """The update replayed from `saved` (restored first) as `coppelius run --digests` does it,
    written to `path` and read back."""
    DR.restore_state(be, saved)
    records = DR.replay(be, L.SUBMISSION_UPDATE, perturb)
    step = DR.StepDigests(be, 0, path, 0)
    DG.write(path, step.header(0, UPDATE_SEQUENCE, records, []))
    return DG.read(path)
