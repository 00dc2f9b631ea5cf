"""The per-launch digests on the cuda backend, for their mechanics (neither driver stand-in computes
the model): on the fake driver, the replay launches each launch of the update alone outside the
graph, reads regions and whole buffers back through its own mapped buffer in window-sized chunks
(the bytes the host uploaded come back), restores the issued state and names the loaded PTX; through
the real cuda-bindings on the C stub, `coppelius run --backend cuda --digests` writes a file that
reads back and bisects clean against itself, with no violation logged."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from tests.support import stub_driver

from coppelius.run import digest_replay as DR
from coppelius.results import digests as DG
from coppelius.backends.cuda import ptx
from coppelius.forensics.bisect import Rules, bisect
from coppelius.plan.launches import regions as LR
from coppelius.plan import profiles, reference
from coppelius.staging import layout as L

from tests.support.fake_driver_fixture import fake  # noqa: F401  (the fixture)
from tests.support.paths import ROOT

TINY = profiles.get("tiny")

pytestmark = pytest.mark.skipif(
    not (ptx.ROOT / "tiny" / "sm_90a" / ptx.MANIFEST).is_file(), reason="kernels_ptx not built")


def test_the_digest_walk_on_the_fake_driver(fake, tmp_path):
    from coppelius.backends.cuda.backend import CudaBackend
    from coppelius.run.ring import Ring
    f = fake()
    be = CudaBackend(TINY)
    try:
        P = reference.init_parameters(TINY)
        be.upload_payload(P.view(np.uint8))
        be.instantiate(-1)
        ring = Ring(be, capacity=4, timeout_s=5)
        ring.run(L.SUBMISSION_FORWARD, 0, None)
        step = DR.StepDigests(be, 0, tmp_path / "d.json", 0)
        step.before(0)
        ring.run(L.SUBMISSION_UPDATE, 0, 0)
        issued, launched = DR.buffer_digests(be), len(f.launch_log)
        step.after(0, 0, ring.issues)
        update = be.plan_submission(L.SUBMISSION_UPDATE)
        assert len(f.launch_log) - launched == len(update.launches)      # each alone, once
        assert [r[0] for r in f.launch_log[launched:]] == \
            [be.kernels[x.kernel].function for x in update.launches]
        assert DR.buffer_digests(be) == issued                           # the issued state back
        payload = np.concatenate([P, np.zeros(2 * TINY.parameter_count, np.float32)])
        assert issued["pmv"] == hashlib.sha256(payload.tobytes()).hexdigest()   # 2 chunks
    finally:
        be.close()
    doc = DG.read(tmp_path / "d.json")
    assert (doc["backend"], doc["target"], doc["replay_matches_issue"]) == ("cuda", "sm_90a", True)
    manifest = ptx.Manifest.load("tiny", "sm_90a")
    assert all(x["code"] == manifest.entries[x["kernel"]].sha256 for x in doc["launches"])
    decay = doc["launches"][1]
    e = TINY.parameter("embed")
    p_read = next(r for r in decay["reads"] if r["name"] == "e_ptr (P)")
    assert p_read["sha256"] == hashlib.sha256(P[e.offset:e.end].tobytes()).hexdigest()
    stage_in = doc["launches"][0]["writes"][0]
    assert stage_in["name"] == "staged_ptr" and stage_in["sample"][-1] == 2   # the doorbell
    assert bisect(doc, doc, Rules())["same"]
    regions = LR.regions(TINY, update.launches[5])
    assert [r["name"] for r in doc["launches"][5]["writes"]] == [r.name for r in regions.writes]


def test_a_cuda_run_with_digests_through_the_real_bindings(tmp_path):
    lib = stub_driver.build()
    if isinstance(lib, str):
        pytest.skip(lib)
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    log, digests = tmp_path / "stub.log", tmp_path / "d.json"
    (tmp_path / "c.ckpt").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "coppelius.cli", "run", "--profile", "tiny", "--backend", "cuda",
         "--steps", "1", "--quiet", "--checkpoint", str(tmp_path / "c.ckpt"), "--result",
         str(tmp_path / "r.bin"), "--directory", str(tmp_path / "run"), "--digests",
         str(digests)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=stub_driver.env(log, lib, COPPELIUS_STUB_QUIET=1))
    assert done.returncode == 0, done.stderr[-3000:]
    assert stub_driver.violations(log) == [] and stub_driver.loaded(log) == 1
    doc = DG.read(digests)
    assert doc["backend"] == "cuda" and doc["replay_matches_issue"], doc["replay_differs"]
    again = subprocess.run([sys.executable, "-m", "coppelius.cli", "bisect", str(digests),
                            str(digests)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no launch differs" in again.stdout
