"""plan/launches/regions.py as data: every launch of every submission of both profiles has regions,
each inside its buffer (or staging) with its buffer's element type, a launch's writes never overlap
one another, and a kernel without a rule is refused by name.  (What the kernels really touch:
tests/plan/test_launch_regions_interpret.py.)"""
from __future__ import annotations

import dataclasses

import pytest

from coppelius.plan.launches import regions as LR
from coppelius.plan import launches, profiles
from coppelius.plan.buffers import buffers
from coppelius.staging import layout as L


def _elements(r: LR.Region) -> list[tuple[int, int]]:
    return [(r.offset + k * r.stride, r.offset + k * r.stride + r.run) for k in range(r.repeat)]


@pytest.mark.parametrize("name", profiles.names())
def test_every_region_lies_inside_its_space(name):
    prof = profiles.get(name)
    bufs = buffers(prof)
    seen = set()
    for sub in launches.submissions(prof):
        for launch in sub.launches:
            regs = LR.regions(prof, launch)
            seen.add(launch.function)
            assert regs.writes, f"{launch.label} writes nothing"
            for r in regs.reads + regs.writes:
                assert r.run > 0 and r.repeat > 0 and (r.repeat == 1 or r.stride >= r.run), r
                if r.space == LR.STAGING:
                    assert r.offset >= 0, (launch.label, r)
                    assert r.end * r.itemsize <= L.TRANSFER_WINDOW, (launch.label, r)
                else:
                    spec = bufs[r.space]
                    assert spec.dtype == r.dtype, (launch.label, r)
                    assert 0 <= r.offset and r.end <= spec.elements, (launch.label, r, spec)
    assert seen <= set(LR.RULES)


@pytest.mark.parametrize("name", profiles.names())
def test_a_launchs_writes_never_overlap_one_another(name):
    prof = profiles.get(name)
    for sub in launches.submissions(prof):
        for launch in sub.launches:
            spans = sorted((r.space, a, b, r.name) for r in LR.regions(prof, launch).writes
                           for a, b in _elements(r))
            for (s0, a0, b0, n0), (s1, a1, b1, n1) in zip(spans, spans[1:]):
                assert s0 != s1 or b0 <= a1, f"{launch.label}: {n0} and {n1} overlap"


def test_every_rule_is_used_by_a_plan():
    used = {x.function for name in profiles.names()
            for sub in launches.submissions(profiles.get(name)) for x in sub.launches}
    assert set(LR.RULES) == used


def test_the_slot_time_is_volatile_and_the_payload_compared():
    prof = profiles.get("tiny")
    release = launches.submissions(prof)[1].launches[-1]
    payload, time = LR.regions(prof, release).writes
    assert (payload.count, payload.volatile, time.count, time.volatile) == (2, False, 2, True)
    assert time.offset == payload.offset + 2
    assert (time.end - payload.offset) * 4 == L.SEMAPHORE_RECORD_BYTES


def test_attention_partials_cover_exactly_the_chunks_that_exist():
    """Slot c of the dK/dV partials holds the kv blocks with more than c chunks (the first ones);
    slot 0 all of them.  The forward has no partials: it writes o16, o32 and lse whole."""
    prof = profiles.get("tiny")
    update = launches.submissions(prof)[1].launches
    fwd = next(x for x in update if x.function == "attention_fwd")
    hd = prof.heads * prof.head_dim
    assert [(r.name, r.count) for r in LR.regions(prof, fwd).writes] == [
        ("o16_ptr", prof.context * hd), ("o32_ptr", prof.context * hd),
        ("lse_ptr", prof.heads * prof.context)]
    bwd = next(x for x in update if x.function == "attention_bwd")
    kv = [r for r in LR.regions(prof, bwd).writes if r.name.startswith("kv_part_ptr")]
    width = 2 * prof.kv_heads * prof.head_dim
    assert kv[0].count == prof.context * width and kv[0].offset == 0
    assert len(kv) > 1 and all(r.count < kv[0].count for r in kv[1:]), \
        "tiny splits its first kv blocks"


def test_a_kernel_without_a_rule_is_refused_by_name():
    prof = profiles.get("tiny")
    launch = dataclasses.replace(launches.submissions(prof)[1].launches[3], function="mystery")
    with pytest.raises(LR.RegionError, match="no region rule for kernel 'mystery'.*hint"):
        LR.regions(prof, launch)
