"""The update's side lane races nothing on the main lane.

The weight-gradient launches (AdamW in their epilogues) run on a side lane of the update's graph
(plan/launches/graph.py) and may overlap any main-lane launch the graph does not order with them.
For every such unordered pair: the main-lane launch must not write what the side-lane launch
reads, nor read or write what it writes.

What is checked, and how the regions are derived (the launch lists carry no read/write roles):
  * the side-lane launch (weight_grad) exactly, from its kernel's contract
    (plan/kernels/weight_grad.py): it reads a_j (T, M_j), b_j (T, N_j) and the doorbell, and
    writes M_j·N_j elements of the P, M and V planes from p_j and of w16 from h_j;
  * every main-lane launch conservatively: each pointer argument counts as both read and written,
    over the slab its reference names when the plan made it with `Context.slab` (a per-layer or
    per-norm-site slab of a stacked buffer), the parameter it points into (all three planes) for
    pmv/w16, and the whole buffer otherwise — except `staged` (the issue's input record and
    doorbell), which only the submission's first launch, release_stage_in, writes (CONTRACT §7): the
    test checks that launch is an ancestor of every side-lane launch and counts the other
    launches' staged arguments as reads.
So a hazard-free result is a real guarantee for the side lane's side, and at worst a false alarm
for the main lane's.  One partition is decided by the data, not by the lists: embed_decay (side
lane, E's absent rows) and embed_fwd / embed_grad (main lane, E's present rows) touch E's rows as
the same staged ids divide them, so their overlap on E is let go here and checked in the
interpreter instead (tests/plan/test_kernels_rows.py: each writes only its own rows, poisoned memory
on the others; test_plan_interpret.py: two topological orders, the same bits).  A mutated list (each dW launch forked one launch too early, before the dh
product that reads its old bf16 weights) must be caught.
"""
from __future__ import annotations

import dataclasses

import pytest

from coppelius.plan.launches import refs as launch_refs
from coppelius.plan import launches
from coppelius.plan import profiles
from coppelius.plan.launches.graph import GraphError, ancestors, dependencies, ordered

Region = tuple[str, int, int]                  # buffer, first element, end (exclusive)


@pytest.fixture(scope="module")
def slabs():
    """{(buffer, offset)} of every reference the plan made with Context.slab (both profiles)."""
    made = set()
    real = launch_refs.Context.slab

    def recording(self, name, index):
        ref = real(self, name, index)
        made.add((ref.buffer, ref.offset))
        return ref

    launch_refs.Context.slab = recording
    try:
        for name in profiles.names():
            launches.submissions(profiles.get(name))
    finally:
        launch_refs.Context.slab = real
    return made


def _param_region(prof, buffer: str, offset: int, size: int | None) -> list[Region]:
    """A parameter range in pmv (all three planes) or w16; size None: the parameter at offset."""
    n = prof.parameter_count
    start = offset % n if buffer == "pmv" else offset
    if size is None:
        q = next(q for q in prof.parameters if q.offset <= start < q.end)
        start, size = q.offset, q.size
    if buffer == "w16":
        return [("w16", start, start + size)]
    return [("pmv", k * n + start, k * n + start + size) for k in range(3)]


def _main_regions(prof, bufs, launch, slabs) -> list[Region]:
    """What a main-lane launch may write (everything it points at, but the staged copy)."""
    out = []
    for _, a in launch.args:
        if not isinstance(a, launches.BufferRef) or a.buffer == "staged":
            continue
        spec = bufs[a.buffer]
        if a.buffer in ("pmv", "w16"):
            out += _param_region(prof, a.buffer, a.offset, None)
        elif (a.buffer, a.offset) in slabs:
            per = spec.elements // spec.shape[0]
            out.append((a.buffer, a.offset, a.offset + per))
        else:
            out.append((a.buffer, 0, spec.elements))
    return out


# main-lane kernels that touch only the E rows the context's ids hold (embed_fwd gathers them,
# embed_grad updates them): disjoint from embed_decay's absent rows by the data
PRESENT_ROWS_ONLY = {"embed_fwd", "embed_grad"}


def _e_rows(prof, launch, other) -> bool:
    """Whether an overlap of side launch `launch` and main launch `other` is the data's partition
    of E's rows (absent for embed_decay, present for the main-lane E kernels)."""
    return launch.function == "embed_decay" and other.function in PRESENT_ROWS_ONLY


def _side_regions(prof, launch) -> tuple[list[Region], list[Region]]:
    """(reads, writes) of a side-lane launch, from its kernel's contract."""
    if launch.function == "embed_decay":          # the staged ids and doorbell; E's absent rows
        ids, bell = launch.arg("ids_ptr"), launch.arg("doorbell_ptr")
        T = launch.arg("T").value
        return ([("staged", ids.offset, ids.offset + T), ("staged", bell.offset, bell.offset + 1)],
                _param_region(prof, "pmv", launch.arg("e_ptr").offset, None))
    if launch.function != "weight_grad":
        raise AssertionError(f"{launch.label}: no read/write contract for {launch.function} on "
                             "the side lane; hint: add it here")
    c, T = dict(launch.constexprs), launch.arg("T").value
    reads = [("staged", launch.arg("doorbell_ptr").offset, launch.arg("doorbell_ptr").offset + 1)]
    writes = []
    for j in range(c["PRODUCTS"]):
        M, N = launch.arg(f"M{j}").value, launch.arg(f"N{j}").value
        a, b = launch.arg(f"a{j}_ptr"), launch.arg(f"b{j}_ptr")
        reads += [(a.buffer, a.offset, a.offset + T * M), (b.buffer, b.offset, b.offset + T * N)]
        writes += _param_region(prof, "pmv", launch.arg(f"p{j}_ptr").offset, M * N)
        writes += _param_region(prof, "w16", launch.arg(f"h{j}_ptr").offset, M * N)
    return reads, writes


def _overlap(r: Region, s: Region) -> bool:
    return r[0] == s[0] and r[1] < s[2] and s[1] < r[2]


def hazards(prof, update, slabs) -> list[str]:
    """Every (side launch, unordered main launch, region) conflict, as text."""
    bufs = launches.buffers(prof)
    anc = ancestors(update.deps)
    assert update.launches[0].function == launches.STAGE_IN          # the staged copy's writer
    found = []
    for i, side in enumerate(update.launches):
        if side.lane == launches.MAIN_LANE:
            continue
        reads, writes = _side_regions(prof, side)
        assert anc[i] & 1, f"{side.label} does not wait for the stage-in"
        for j, main in enumerate(update.launches):
            if main.lane != launches.MAIN_LANE or ordered(anc, i, j) or _e_rows(prof, side, main):
                continue
            for r in _main_regions(prof, bufs, main, slabs):
                for s in reads + writes:
                    if _overlap(r, s):
                        what = "writes" if s in writes else "reads"
                        found.append(f"{side.label} {what} {s}, unordered {main.label} touches {r}")
            staged = [a for _, a in main.args
                      if isinstance(a, launches.BufferRef) and a.buffer == "staged"]
            for s in writes:                          # a staged read against a side write
                found += [f"{side.label} writes {s}, unordered {main.label} reads it"
                          for a in staged if s[0] == "staged"]
    return found


@pytest.mark.parametrize("name", profiles.names())
def test_side_lane_races_nothing(name, slabs):
    prof = profiles.get(name)
    update = launches.submissions(prof)[1]
    side = [x for x in update.launches if x.lane == launches.SIDE_LANE]
    # E's absent rows, the head and each layer's halves
    assert [x.function for x in side] == ["embed_decay"] + ["weight_grad"] * (2 * prof.layers + 1)
    anc = ancestors(update.deps)
    unordered = sum(not ordered(anc, i, j) for i, x in enumerate(update.launches)
                    if x.lane == launches.SIDE_LANE for j in range(len(update.launches)))
    assert unordered > len(side)                            # there is overlap to check
    assert hazards(prof, update, slabs) == []


def test_a_fork_before_the_last_reader_is_caught(slabs):
    """Each dW launch forked one main-lane launch earlier — before the dh product that still
    reads the old bf16 weights it overwrites — is a race the check must report."""
    prof = profiles.get("tiny")
    update = launches.submissions(prof)[1]
    labels = [x.label for x in update.launches]
    early = []
    for x in update.launches:
        if x.function == "weight_grad":
            fork = labels.index(x.after[0])
            prev = next(labels[k] for k in range(fork - 1, -1, -1)
                        if update.launches[k].lane == launches.MAIN_LANE)
            x = dataclasses.replace(x, after=(prev,))
        early.append(x)
    early = tuple(early)
    mutated = dataclasses.replace(update, launches=early, deps=dependencies(early))
    found = hazards(prof, mutated, slabs)
    assert any("dh" in f and "w16" in f for f in found), found[:3]


def test_graph_refusals():
    """dependencies() refuses what a backend could not capture as planned."""
    update = launches.submissions(profiles.get("tiny"))[1].launches
    side = next(i for i, x in enumerate(update) if x.lane == launches.SIDE_LANE)
    cases = {
        "no launch": update[:side] + (dataclasses.replace(update[side], after=("nope",)),)
        + update[side + 1:],
        "comes later": update[:side] + (dataclasses.replace(update[side], after=(update[-1].label,)),)
        + update[side + 1:],
        "without waiting": update[:side] + (dataclasses.replace(update[side], after=()),)
        + update[side + 1:],
        "does not wait for": update[:-1] + (dataclasses.replace(update[-1], after=()),),
    }
    for message, lst in cases.items():
        with pytest.raises(GraphError, match=message):
            dependencies(lst)
