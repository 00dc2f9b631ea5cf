"""Fresh bytes (tools/cost/fresh.py): what a launch reads that a launch it waits for just wrote,
from the plan's regions — overlaps computed by hand, L2's capacity, and the update list."""
from __future__ import annotations

from tests.support.cost_fixtures import PROD, UPDATE
from coppelius.plan import launches
from coppelius.plan.launches.regions import STAGING, Region
from tools.cost.fresh import fresh_bytes, fresh_of, overlap
from tools.cost.inputs import L2_BYTES


def _r(space, offset, run, dtype="fp32", **kw) -> Region:
    return Region("x", space, offset, run, dtype, **kw)


def test_overlap_by_hand():
    assert overlap(_r("a", 0, 100), _r("a", 50, 100)) == 50 * 4         # the common 50 elements
    assert overlap(_r("a", 0, 100), _r("b", 0, 100)) == 0.0              # another buffer
    assert overlap(_r(STAGING, 0, 100), _r(STAGING, 0, 100)) == 0.0      # staging is not in L2
    assert overlap(_r("a", 0, 10), _r("a", 10, 10)) == 0.0               # adjacent, not common
    # a strided write (4 runs of 10, 20 apart: 40 of its span's 70 elements): a read of the whole
    # span holds all 40; a read of its first 35 elements the span's density of them, 20 (the
    # runs [0, 10) and [20, 30) exactly)
    strided = _r("a", 0, 10, repeat=4, stride=20)
    assert overlap(_r("a", 0, 70), strided) == 40 * 4
    assert overlap(_r("a", 0, 35), strided) == 20 * 4


def test_only_what_fits_in_l2_is_fresh():
    read = _r("a", 0, 1000)
    assert fresh_of([read], [(_r("a", 0, 1000),)]) == 4000
    # the predecessor wrote twice L2 in all: half of what it wrote is still there
    big = int(2 * L2_BYTES / 4)
    assert fresh_of([read], [(_r("a", 0, 1000), _r("b", 0, big - 1000))]) == 2000
    # two predecessors writing the same bytes: never more than the read itself
    assert fresh_of([read], [(_r("a", 0, 1000),), (_r("a", 0, 1000),)]) == 4000


def test_the_update_lists_fresh_reads():
    sub = launches.submissions(PROD)[1]
    got = dict(zip((x.label for x in sub.launches), fresh_bytes(PROD, sub)))
    T, D = 1024, 512
    # the norms read the split-K partials the product before them wrote
    assert got["layers.0.mlp.residual+norm"] == 4 * T * D * 4
    assert got["layers.0.mlp_backward.norm"] == 4 * T * D * 4
    # the stage-in reads only staging
    assert got["prelaunch_release+stage_in"] == 0.0
    assert all(0.0 <= v for v in got.values()) and set(got) == set(UPDATE)
