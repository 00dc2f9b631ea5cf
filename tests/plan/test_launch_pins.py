"""The launch lists are pinned: a digest of every launch's entry, grid, arguments and constexprs.

A refactor of plan/launch*.py must leave these digests alone (the compiled specializations, and
so the committed PTX, stay what they were).  A change on purpose changes them: rebuild the PTX
(tools/build_ptx.py), check the rebuild test, and update the pin here to the value the failure
prints, saying in the commit what moved.
"""
from __future__ import annotations

import dataclasses
import hashlib

import pytest

from coppelius.plan import launches, profiles

# profile: (sha256 of the launch lists, launches per submission, distinct compiled entries)
PINS = {
    # every weight gradient at 128×128 on 4 warps, 130 programs (the MLP half no longer
    # 128×256: it shares the attention half's entry, 32 → 31); digests moved with the import
    # name alone (each launch's module is coppelius.plan.kernels.X), the PTX byte for byte.
    # embed_fwd takes V (an id outside [0, V) gathers a zero row) and cross_entropy
    # the inputs and CE_BAD_ID (it marks such a row): those two entries' PTX moved, no other.
    # The attention forward is one launch a layer (no merge, no partial buffers; its own key
    # block and 3 stages): one launch fewer per layer in each submission and one compiled entry
    # fewer (the merge's); the other entries' PTX byte for byte.  Then two tuning changes:
    # cross_entropy and predictions on 8 warps, the dK/dV backward in chunks of ≤ 11 trips
    # (attention_bwd and attention_bwd_dq's entries; 120 → 128 programs).  Then the head on
    # 256 × 128 tiles and its dx on 256 × 128 tiles in 8 K ranges: the head's entry moved, its dx
    # has one of its own (it shared an entry with the 128 × 128 products into a norm: 30 → 31),
    # and the final norm backward reads 8 partials (its entry moved); the gain gradients on 16
    # columns a program (both rmsnorm_bwd_gain entries moved); both head products in K blocks of
    # 32 (their two entries moved: 73,728 B of shared memory, not 147,456).  tiny: 64 norm rows a
    # program and the SwiGLU forward on 64 × 64 tiles, so that no tiny kernel spills but one
    # (every norm and the SwiGLU entry moved; the goldens' bits did not); then its attention on
    # 64 × 64 blocks, so that none spills (the three attention entries moved; the dK/dV and dQ
    # sums regroup their fp32 terms: the goldens were made again)
    "coppelius": ("8229453621f7457dae1809054d25373e8bbb459d1d42b950430c4056478f9850", (72, 164, 71), 31),
    "tiny": ("bbfdb91f20d59d7ab2c9998b3a18619afd0c9ccc31d7bee8ede38fd4e0d7bc0b", (23, 45, 22), 27),
}


def launch_lists_digest(subs) -> str:
    """sha256 of repr() of every launch's fields (its lane and `after` labels included) and of
    each submission's dependency graph, submission by submission, in order."""
    lists = [(s.name, [(x.kernel, x.module, x.function, x.grid, x.args, x.constexprs, x.num_warps,
                        x.num_stages, x.label, x.lane, x.after) for x in s.launches], s.deps)
             for s in subs]
    return hashlib.sha256(repr(lists).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(PINS))
def test_launch_lists_match_their_pin(name):
    prof = profiles.get(name)
    subs = launches.submissions(prof)
    digest, counts, entries = PINS[name]
    got_counts = tuple(len(s.launches) for s in subs)
    assert got_counts == counts, f"{name}: launches per submission {got_counts}, pinned {counts}"
    assert len(launches.kernels(prof)) == entries, f"{name}: compiled entries changed"
    got = launch_lists_digest(subs)
    assert got == digest, (f"{name}: launch lists changed (digest {got}); if on purpose, rebuild the "
                           "PTX and update PINS in tests/plan/test_launch_pins.py")


@pytest.mark.parametrize("field,value", [("constexprs", (("EXTRA", 1),)), ("grid", (2, 1, 1)),
                                         ("args", ()), ("num_warps", 2), ("lane", 1)])
def test_digest_sees_one_changed_field(field, value):
    """The pin covers every field: one field of one launch changed changes the digest."""
    subs = launches.submissions(profiles.get("tiny"))
    update = subs[1]
    changed = dataclasses.replace(update.launches[3], **{field: value})
    edited = dataclasses.replace(update, launches=update.launches[:3] + (changed,) + update.launches[4:])
    assert launch_lists_digest((subs[0], edited, subs[2])) != launch_lists_digest(subs)
