"""`coppelius diff`'s last line, the next step toward the kernel, works when followed literally:
each side runs again from a checkpoint of its own holding the state both started from (a run
advances its checkpoint in place: two sides sharing one file start from different updates, and
bisect refuses the pair `c0 0 vs 1`); files from different update counts get no bisect command.
tests/host/cli/test_hints_run.py runs the hint as printed."""
from __future__ import annotations

from coppelius.cli.render_diff import bisect_hint


def _report(c0_a: int, c0_b: int, step: int = 3, across: bool = False,
            backends=("interpret", "interpret")) -> dict:
    return {"a": {"c0": c0_a, "profile": "tiny"}, "b": {"c0": c0_b, "profile": "tiny"},
            "across_backends": across, "first": {"section": "steps", "step": step},
            "identity": [{"field": "backend", "a": backends[0], "b": backends[1]}]}


def test_the_hint_names_a_fresh_checkpoint_per_side_for_runs_from_update_0():
    hint = bisect_hint(_report(0, 0))
    assert "`: > A.ckpt; : > B.ckpt`" in hint, hint
    for side in "AB":
        assert (f"`coppelius run --profile tiny --backend interpret --checkpoint {side}.ckpt "
                f"--result {side}.bin --steps 3 --digests {side}.json --digest-step 2`") in hint
    assert hint.endswith("then `coppelius bisect A.json B.json`"), hint


def test_the_hint_names_a_copy_per_side_of_the_checkpoint_a_continued_run_started_from():
    hint = bisect_hint(_report(40, 40, across=True, backends=("cuda", "interpret")))
    assert "`cp START.ckpt A.ckpt; cp START.ckpt B.ckpt`" in hint and "update 40" in hint
    assert "--backend cuda --checkpoint A.ckpt" in hint, hint
    assert "--backend interpret --checkpoint B.ckpt" in hint, hint
    assert hint.endswith("--across-backends`"), hint


def test_runs_from_different_update_counts_get_no_bisect_command():
    """c0 0 vs 8 (the demo's run beside its continuation): nothing to bisect, and no command
    that bisect would refuse."""
    hint = bisect_hint(_report(0, 8))
    assert "c0 0 vs 8" in hint and "coppelius bisect" not in hint and "--digests" not in hint
