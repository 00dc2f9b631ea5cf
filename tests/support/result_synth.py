"""Synthetic result files for the tests: every section as the run loop would hand it over.

`synthesize(profile, outcome, steps)` builds a plausible file (a decaying loss curve with noise,
≈ 50 ms of device time a step, the tail the run loop writes for that outcome) without running
anything; `Synthetic.write` passes it through the real `ResultWriter`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coppelius.results.writer import ResultWriter
from coppelius.staging import layout as L
from coppelius.staging import records as R
from coppelius.staging import result_sections as RS

SEMAPHORE_SLOTS = len(L.SUBMISSIONS)                # one slot per plan submission
ROW_WORDS = L.STEP_WINDOW_BYTES // 4                # 1024 rows a step


@dataclass
class Synthetic:
    """Every part of a result file, as the run loop would hand them to the writer."""
    profile: object
    forward: bytes
    windows: np.ndarray         # (steps, 1024) f32
    stat: bytes
    loss_block: bytes
    final: bytes
    semaphores: bytes
    error_notifier: bytes
    status: bytes
    timestamps: bytes

    def write(self, path, overwrite: bool = False) -> None:
        with ResultWriter.create(path, self.profile, overwrite=overwrite) as w:
            w.write_forward(self.forward)
            for row in self.windows:
                w.append_step(row)
            w.write_tail(self.stat, self.loss_block, self.final, self.semaphores,
                         self.error_notifier, self.status, self.timestamps)

    def part(self, section: str) -> bytes:
        """The bytes of one section, by its name in `coppelius.staging.result_sections`."""
        return self.windows.tobytes() if section == "steps" else getattr(self, section)

    def expected_bytes(self) -> bytes:
        return b"".join(self.part(name) for name in RS.NAMES)


def synthesize(profile, outcome: int = R.OUTCOME_COMPLETED, steps: int | None = None,
               seed: int = 0, c0: int = 0) -> Synthetic:
    """A plausible result file for tests and demos: a decaying loss curve with noise, realistic
    timestamps (≈ 50 ms device time a step), and the tail the run loop writes for `outcome`.
    `steps` is the completed step count (default: all for completed, half otherwise)."""
    rng = np.random.default_rng(seed)
    V, planned = profile.vocab, profile.steps
    if steps is None:
        steps = planned if outcome == R.OUTCOME_COMPLETED else planned // 2
    # issues: forward, the completed updates, then per outcome the failed update / the final
    failed_update = outcome == R.OUTCOME_DEVICE_ERROR
    final_issued = outcome in (R.OUTCOME_COMPLETED, R.OUTCOME_INTERRUPTED)
    issues = 1 + steps + int(failed_update) + int(final_issued)
    gp_get = issues - int(failed_update)

    t = np.arange(steps, dtype=np.float64)[:, None]
    floor = 0.6 * np.log(V)
    curve = floor + (np.log(V) - floor) * np.exp(-t / max(planned / 8, 1))
    noise = rng.standard_normal((steps, ROW_WORDS), dtype=np.float32)      # (steps, 1024)
    windows = (curve.astype(np.float32) * np.abs(1 + np.float32(0.3) * noise)).astype("<f4")
    forward = rng.normal(0, 2, (L.RECORD_FORWARD_ROWS, V)).astype("<f4")
    final = rng.normal(0, 3, V).astype("<f4")
    loss_block = rng.normal(0, 1, (L.LOSS_WINDOWS, L.LOSS_WINDOW_WORDS)).astype("<f4")
    if steps:
        loss_block[L.W0_LAST_CE] = windows[-1]

    # timestamps: host issue → device pre-launch (+20 µs) → final (+~50 ms) → fence (+30 µs)
    ts = np.zeros(issues, R.TIMESTAMP_ENTRY.dtype)
    sub = np.full(issues, L.SUBMISSION_UPDATE, np.uint32)
    sub[0] = L.SUBMISSION_FORWARD
    if final_issued:
        sub[-1] = L.SUBMISSION_FINAL
    step = np.full(issues, R.TIMESTAMP_NO_STEP, np.uint32)
    upd = np.flatnonzero(sub == L.SUBMISSION_UPDATE)
    step[upd] = np.arange(upd.size)
    dev = np.where(sub == L.SUBMISSION_UPDATE, 50e6, 15e6) * rng.lognormal(0, 0.05, issues)
    gap = rng.gamma(4.0, 10e3, issues)                      # host gap ≈ 40 µs
    issue_ns = 1_000_000_000 + np.cumsum(np.concatenate([[0], (dev + 50e3 + gap)[:-1]]))
    ts["submission"], ts["sequence"], ts["step"] = sub, np.arange(1, issues + 1), step
    ts["context"] = c0 + np.where(step == R.TIMESTAMP_NO_STEP, max(steps - 1, 0) * final_issued,
                                  step)
    ts["context"][0] = c0
    ts["host_issue_ns"] = issue_ns
    ts["device_prelaunch_ns"] = 5_000_000_000_000 + issue_ns + 20e3
    ts["device_final_ns"] = ts["device_prelaunch_ns"] + dev
    ts["host_fence_ns"] = issue_ns + dev + 50e3
    ts["host_wall_issue_ns"] = 1_795_000_000_000_000_000 + issue_ns
    ts["flags"] = R.FLAG_FENCE_OBSERVED
    if failed_update:
        ts["flags"][-1] = R.FLAG_ERROR
        ts["host_fence_ns"][-1] = 0
        ts["device_final_ns"][-1] = 0

    sems = np.zeros(SEMAPHORE_SLOTS, R.SEMAPHORE_SLOT.dtype)
    for s in range(SEMAPHORE_SLOTS):
        mine = np.flatnonzero(sub == s)
        if mine.size:
            last = ts[mine[-1]]
            sems[s]["prelaunch_payload"] = last["sequence"]
            sems[s]["prelaunch_timestamp"] = last["device_prelaunch_ns"]
            if last["flags"] & R.FLAG_FENCE_OBSERVED:
                sems[s]["final_payload"] = last["sequence"]
                sems[s]["final_timestamp"] = last["device_final_ns"]

    # every publication the run loop starts completes: each interval, and an interrupted run's
    # last step when it is not one (host/run/loop.py)
    publications = steps // profile.checkpoint_interval + int(
        outcome == R.OUTCOME_INTERRUPTED and steps % profile.checkpoint_interval != 0)
    wall = int(ts["host_fence_ns"].max() - issue_ns[0]) + 3_000_000_000
    preds = rng.integers(0, V, (3, 2)).astype(np.uint32)
    preds[:, 1] = 1
    digest = rng.integers(0, 256, 32, dtype=np.uint8)
    status = R.STATUS_BLOCK.pack(
        magic=R.STATUS_MAGIC, version=R.STATUS_VERSION_1, outcome=outcome, c0=c0,
        steps_planned=planned, steps_completed=steps, update_count=c0 + steps,
        gp_get=gp_get, gp_put=issues, publications=publications, backend=R.BACKEND_CUDA, wall_ns=wall,
        predictions=preds, compute_capability=90, driver_version=12080, checkpoint_sha256=digest,
        device_name="NVIDIA H200")
    if outcome == R.OUTCOME_COMPLETED:
        notifier = R.ERROR_NOTIFIER.pack(step=R.NOTIFIER_NO_STEP)
    else:
        info, why = {R.OUTCOME_DEVICE_ERROR: (700, "CUDA_ERROR_ILLEGAL_ADDRESS in update"),
                     R.OUTCOME_INTERRUPTED: (0, "interrupted by SIGINT"),
                     R.OUTCOME_HOST_ERROR: (R.INFO_HOST_IO, "host I/O: No space left on device")
                     }[outcome]
        failed_step = steps if outcome != R.OUTCOME_INTERRUPTED else R.NOTIFIER_NO_STEP
        notifier_status = R.NOTIFIER_STATUS_NONE if outcome == R.OUTCOME_INTERRUPTED \
            else R.NOTIFIER_STATUS_ERROR        # an interruption is no error (CONTRACT §8)
        notifier = R.ERROR_NOTIFIER.pack(
            time_ns=1_795_000_000_000_000_000 + wall, info32=info,
            info16=L.SUBMISSION_UPDATE, status=notifier_status,
            sequence=issues if failed_update else 0, step=failed_step, reason=why)
    stat = R.STAT_RECORD.pack(
        st_dev=2049, st_ino=131072 + seed, st_size=0, st_mode=0o100644, st_nlink=1, st_uid=1000,
        st_gid=1000, st_atime_ns=1_795_000_000_000_000_000, st_mtime_ns=1_795_000_000_000_000_000,
        st_ctime_ns=1_795_000_000_000_000_000, st_blocks=0, st_blksize=4096, update_count=c0,
        gp_get=gp_get, gp_put=issues, semaphore_word=int(sems[0]["final_payload"]))
    return Synthetic(profile=profile, forward=forward.tobytes(), windows=windows, stat=stat,
                     loss_block=loss_block.tobytes(), final=final.tobytes(),
                     semaphores=sems.tobytes(), error_notifier=notifier, status=status,
                     timestamps=ts.tobytes())
