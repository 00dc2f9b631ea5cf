"""AdamW runs inside the weight-gradient launches and embed_grad, so the update list
itself carries the optimizer's ordering: every parameter is updated exactly once per update, by a
launch after the last launch that reads it (its bf16 copy or its P plane), and nothing reads a
parameter once it is updated.  Checked on the launch lists as data, for both profiles."""
from __future__ import annotations

import pytest

from coppelius.plan import launches, profiles
from coppelius.plan.launches.graph import ancestors

# the parameters a launch updates: (function, pointer argument) → the P-plane pointer of the
# first parameter; weight_grad's products cover M·N elements from there (adjacent parameters)
WRITES = {"weight_grad": (("p0_ptr", "M0", "N0"), ("p1_ptr", "M1", "N1")),
          "embed_grad": (("e_ptr", None, None), ("gain0_ptr", None, None),
                         ("gain1_ptr", None, None)),
          "embed_decay": (("e_ptr", None, None),)}
# E's rows are divided by the data: embed_decay updates the rows no id of the
# context holds, at the start; embed_grad the present ones, at the end; embed_fwd reads only
# present rows.  So E counts as two parameters here: "embed" (present rows) and this one.
ABSENT = "embed[absent rows]"
PRESENT_ROWS_ONLY = {"embed_fwd", "embed_grad"}


def _param_at(prof, offset: int):
    for q in prof.parameters:
        if q.offset <= offset < q.end:
            return q
    raise AssertionError(f"offset {offset} is inside no parameter")


def _covered(prof, first, size: int) -> set[str]:
    names, covered = [q.name for q in prof.parameters], set()
    i, left = names.index(first.name), size
    while left > 0:
        q = prof.parameters[i]
        covered.add(q.name)
        left -= q.size
        i += 1
    assert left == 0, f"an update from {first.name} of {size} elements splits a parameter"
    return covered


def _updates_and_reads(prof, launch):
    """(parameters this launch updates, parameters it reads) by name."""
    written, reads = set(), set()
    skip = set()
    if launch.function == "weight_grad" and dict(launch.constexprs)["PRODUCTS"] == 1:
        skip = {"a1_ptr", "b1_ptr", "p1_ptr", "h1_ptr"}            # unread with one product
    for ptr, m, n in WRITES.get(launch.function, ()):
        if ptr in skip:
            continue
        first = _param_at(prof, launch.arg(ptr).offset)
        size = launch.arg(m).value * launch.arg(n).value if m else first.size
        written |= _covered(prof, first, size)
        skip |= {ptr, "h" + ptr[1:]}
    for name, a in launch.args:
        if name in skip or not isinstance(a, launches.BufferRef) or a.buffer not in ("pmv", "w16"):
            continue
        offset = a.offset % prof.parameter_count if a.buffer == "pmv" else a.offset
        reads.add(_param_at(prof, offset).name)
    if launch.function == "embed_decay":
        written = {ABSENT if q == "embed" else q for q in written}
    if "embed" in reads and launch.function not in PRESENT_ROWS_ONLY:
        reads.add(ABSENT)                          # a reader of every row reads the absent ones
    return written, reads


@pytest.mark.parametrize("name", profiles.names())
def test_every_parameter_updated_once_after_its_last_reader(name):
    prof = profiles.get(name)
    update = launches.submissions(prof)[1].launches
    updated_at: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for i, launch in enumerate(update):
        written, reads = _updates_and_reads(prof, launch)
        for q in written:
            assert q not in updated_at, \
                f"{q} updated twice: {update[updated_at[q]].label}, {launch.label}"
            updated_at[q] = i
        for q in reads:
            last_read[q] = i
    every = {q.name for q in prof.parameters} | {ABSENT}
    assert set(updated_at) == every, f"never updated: {sorted(every - set(updated_at))}"
    for q, i in updated_at.items():
        assert last_read.get(q, -1) < i, (f"{q} is read by {update[last_read[q]].label} at or "
                                          f"after its update in {update[i].label}")
    # and in the graph, not only the list (updates run on the side lane):
    # every reader of a parameter finishes before its update starts
    anc = ancestors(launches.submissions(prof)[1].deps)
    for i, launch in enumerate(update):
        for q in _updates_and_reads(prof, launch)[1]:
            if q in updated_at and i != updated_at[q]:
                up = updated_at[q]
                assert anc[up] >> i & 1, (f"{q}: {launch.label} reads it, unordered with its "
                                          f"update {update[up].label}")


@pytest.mark.parametrize("name", profiles.names())
def test_no_update_in_the_forward_and_final_lists(name):
    prof = profiles.get(name)
    for sub in (launches.submissions(prof)[0], launches.submissions(prof)[2]):
        assert not [x.label for x in sub.launches if x.function in WRITES], sub.name
