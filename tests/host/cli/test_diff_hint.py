"""`coppelius diff`'s last line, the next step toward the kernel, works when followed literally:
it says to start each run again from the checkpoint it started from (a run advances its
checkpoint in place; rerunning from it digests a later step, and bisect refuses the pair)."""
from __future__ import annotations

from coppelius.cli.render_diff import bisect_hint


def _report(c0_a: int, c0_b: int, step: int = 3, across: bool = False) -> dict:
    return {"a": {"c0": c0_a}, "b": {"c0": c0_b}, "across_backends": across,
            "first": {"section": "steps", "step": step}}


def test_the_hint_names_a_fresh_checkpoint_for_runs_from_update_0():
    hint = bisect_hint(_report(0, 0))
    assert "from a fresh checkpoint (the runs started at update 0)" in hint, hint
    assert "--steps 3 --digests A.json --digest-step 2" in hint, hint
    assert hint.endswith("then coppelius bisect A.json B.json"), hint


def test_the_hint_names_the_checkpoint_a_continued_run_started_from():
    hint = bisect_hint(_report(40, 40, across=True))
    assert "a copy of the checkpoint it started from (update 40, saved before it ran)" in hint
    assert "--checkpoint START.ckpt" in hint and hint.endswith("--across-backends"), hint
    assert "update 7/40" in bisect_hint(_report(40, 7))
