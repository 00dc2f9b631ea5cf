"""The per-launch digests of one update step, the same rule on every backend.

`coppelius run … --digests FILE [--digest-step N]`: before step N's issue the device buffers and
staging (below the transfer window, which a publication may be using) are saved; the step is issued
as every other step is (the product path: the CUDA graph on cuda) and its fence observed; the state
after it is saved, the state before it restored, and the submission's launches are run again one
at a time in list order (a valid order of the graph), outside the graph, each one complete before
the next.  Before a launch its declared reads are summarized, after it its declared writes
(plan/launches/regions.py, host/results/digests.py).  Then every buffer's bytes are compared with the issued
step's (`replay_matches_issue`: the graph and the launches alone gave the same bits) and the issued
state is restored, so the run goes on exactly as without digests.  The replay starts from the state
the issued step started from on this backend, so two backends' files describe the same
computation from their own step-N state (step 0 from a fresh checkpoint: the same P, M, V).
The backend gives the primitives (run one launch, read and write bytes, save and restore buffers);
this module owns the order, the regions and the summaries.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from coppelius.plan.launches import regions as LR
from coppelius.staging import layout as L

from coppelius.results import digests as DG
from coppelius.backends.base import window_chunks
from coppelius.staging.errors import UserError

STAGING_SAVED = L.TRANSFER_WINDOW      # staging bytes saved and restored: all below the window
# how each backend issues a step (the file says how it was made)
ISSUED = {"cuda": "issued as its CUDA graph (the product path)",
          "interpret": "issued as one submission (its launches in a topological order of the "
                       "graph, as every step)"}


class DigestRefused(UserError):
    """A digests request the run refuses before any work."""


def check_request(step: int, steps: int) -> None:
    if not 0 <= step < steps:
        raise DigestRefused(f"--digest-step {step} is outside this run's steps 0..{steps - 1}",
                            f"this run makes {steps} step(s); pass --steps above {step}")


def plan_digest(profile, sub) -> str:
    """sha256 of a submission's launch list and every launch's regions: two files compare only
    when their plans are this same data."""
    h = hashlib.sha256()
    for launch in sub.launches:
        h.update(repr((launch, LR.regions(profile, launch))).encode())
    return h.hexdigest()


def code_digests(backend, sub) -> dict:
    """kernel entry → the digest of what runs it: the loaded PTX file's sha256 on cuda, the
    Triton source's (or the hand-written PTX's) on the interpreter."""
    return {launch.kernel: backend.code_sha256(launch) for launch in sub.launches}


def replay(backend, submission: int, perturb=None) -> list[dict]:
    """Each launch of the submission alone, in list order: its reads' summaries before it, its
    writes' after it.  `perturb(backend, index, launch, regions)`, a test's hook, runs between
    a launch and the reading of its writes."""
    profile, sub = backend.profile, backend.plan_submission(submission)
    produced: dict = {}         # region → (launch, write index, sha256) of its latest write
    out = []
    codes = code_digests(backend, sub)
    for i, launch in enumerate(sub.launches):
        regs = LR.regions(profile, launch)
        reads = [DG.summary(r, backend.read_region(r), sample=False) for r in regs.reads]
        for r, rec in zip(regs.reads, reads):
            made = produced.get(_key(r))
            if made is not None and made[2] == rec["sha256"]:
                rec["source"] = [made[0], made[1]]
        backend.run_launch(submission, i)
        if perturb is not None:
            perturb(backend, i, launch, regs)
        writes = [DG.summary(r, backend.read_region(r)) for r in regs.writes]
        for j, (r, rec) in enumerate(zip(regs.writes, writes)):
            produced[_key(r)] = (i, j, rec["sha256"])
        out.append({"index": i, "label": launch.label, "function": launch.function,
                    "kernel": launch.kernel, "code": codes[launch.kernel], "lane": launch.lane,
                    "reads": reads, "writes": writes})
    return out


SOAK_MADE = ("the same update step replayed again from the one saved state before it, launch by "
             "launch, each repetition's write digests compared with the first's; `differing` holds "
             "every repetition that did not match, whole (coppelius soak names the first launch "
             "and region that differ)")


def _writes(records: list) -> list:
    return [[w["sha256"] for w in x["writes"]] for x in records]


def _key(r) -> tuple:
    return (r.space, r.offset, r.run, r.repeat, r.stride, r.dtype)


@dataclass
class StepDigests:
    """The run loop's hooks for one digested step: `before(s)` ahead of step s's issue,
    `after(s, …)` once its fence is observed and its loss row taken."""
    backend: object
    step: int
    path: Path
    c0: int
    perturb: object = None          # tests and tools only (the command line never sets it)
    repetitions: int = 1            # --soak K: the step replayed K times from one saved state
    perturb_repetition: int = 0     # the repetition `perturb` runs in (tests: a transient fault)
    _before: dict | None = field(default=None, repr=False)

    def before(self, s: int) -> None:
        if s == self.step:
            self._before = save_state(self.backend)

    def after(self, s: int, context: int, sequence: int) -> None:
        if s != self.step:
            return
        b = self.backend
        issued_digests = buffer_digests(b)
        issued = save_state(b)
        try:
            records = self._replay(0, sequence)
            differs = [n for n, d in buffer_digests(b).items() if d != issued_digests[n]]
            differs += _staging_differs(b, issued)
            soak = [] if self.repetitions <= 1 else \
                [self._repeat(k, sequence, records) for k in range(1, self.repetitions)]
        finally:
            restore_state(b, issued)
            b.free_saved(issued["buffers"])
            b.free_saved(self._before["buffers"])
            self._before = None
        doc = self.header(context, sequence, records, differs)
        if self.repetitions > 1:
            doc["soak"] = {"repetitions": self.repetitions, "made": SOAK_MADE,
                           "differing": [r for r in soak if r is not None]}
        DG.write(self.path, doc)

    def _replay(self, k: int, sequence: int) -> list:
        """Repetition k of the step's launches, from the state saved before it."""
        restore_state(self.backend, self._before)
        self.backend.staging.doorbell[0] = sequence     # as the ring rang it after `before`
        perturb = self.perturb if k == self.perturb_repetition else None
        return replay(self.backend, L.SUBMISSION_UPDATE, perturb)

    def _repeat(self, k: int, sequence: int, first: list) -> dict | None:
        """Repetition k compared with the first by its writes' sha256: None when equal, else
        the repetition with its launches (for the bisect: coppelius.forensics.bisect.soak)."""
        records = self._replay(k, sequence)
        if _writes(records) == _writes(first):
            return None
        return {"repetition": k, "launches": records}

    def header(self, context: int, sequence: int, records: list, differs: list) -> dict:
        b = self.backend
        info = b.device()
        sub = b.plan_submission(L.SUBMISSION_UPDATE)
        return {"profile": b.profile.name, "submission": L.SUBMISSIONS[L.SUBMISSION_UPDATE],
                "plan": plan_digest(b.profile, sub), "launch_count": len(records),
                "step": self.step, "c0": self.c0, "context": context, "sequence": sequence,
                "t_base": self.c0 - 1, "backend": b.name, "device": info.name,
                "target": info.target, "compute_capability": info.compute_capability,
                "driver_version": info.driver_version,
                "made": (f"update step {self.step} {ISSUED.get(b.name, 'issued')}; then the "
                         "buffers and staging restored to their state before it and its "
                         f"{len(records)} launches run again one at a time in list order, "
                         "outside the graph, each complete before the next: reads summarized "
                         "before a launch, writes after it; then the issued state restored"),
                "replay_matches_issue": not differs, "replay_differs": differs,
                "sample": DG.SAMPLE, "launches": records}


def save_state(backend) -> dict:
    """Every device buffer (device copies) and the staging bytes below the transfer window."""
    return {"buffers": backend.save_buffers(),
            "staging": backend.staging.raw[:STAGING_SAVED].copy()}


def restore_state(backend, saved: dict) -> None:
    backend.restore_buffers(saved["buffers"])
    backend.staging.raw[:STAGING_SAVED] = saved["staging"]


def buffer_digests(backend) -> dict[str, str]:
    """sha256 of every device buffer's bytes, read back in transfer-window chunks."""
    out = {}
    for name, spec in backend.plan_buffers().items():
        h = hashlib.sha256()
        for offset, n in window_chunks(spec.nbytes):
            h.update(backend.read_bytes(name, offset, n).tobytes())
        out[name] = h.hexdigest()
    return out


def _staging_differs(backend, issued: dict) -> list[str]:
    """Staging below the window, the semaphore slots apart (their device times differ)."""
    now, then = backend.staging.raw[:STAGING_SAVED], issued["staging"]
    slots = slice(L.SEMAPHORES, L.SEMAPHORES + L.SEMAPHORE_REGION_BYTES)
    same = (now[:slots.start] == then[:slots.start]).all() and \
        (now[slots.stop:] == then[slots.stop:]).all()
    return [] if same else ["staging"]
