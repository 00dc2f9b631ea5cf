"""CONTRACT §7: mapped host memory is read once per issue — a submission's first launch
(release_stage_in) copies the input record and the doorbell into device memory, and no later
launch reads staging.  Later launches may still *write* staging (the loss record, the windows,
the records, the predictions, the final release's semaphore record): those parameters are listed
below, and the kernels' sources are checked to only ever store through them."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap

import pytest

from coppelius.plan import launches, profiles
from tests.support.paths import ROOT

# (function, parameter): staging arguments a launch after the first one may take — write-only
WRITE_ONLY = {("cross_entropy", "loss_ptr"), ("cross_entropy", "w0_ptr"), ("embed_grad", "w1_ptr"),
              ("embed_decay", "w1_ptr"),
              ("copy_f32", "dst_ptr"), ("predictions", "pred_ptr"), (launches.RELEASE, "slot_ptr")}


@pytest.mark.parametrize("name", profiles.names())
def test_only_the_first_launch_reads_staging(name):
    for sub in launches.submissions(profiles.get(name)):
        first, rest = sub.launches[0], sub.launches[1:]
        assert first.function == launches.STAGE_IN, sub.name
        for launch in rest:
            for param, a in launch.args:
                if isinstance(a, launches.StagingRef):
                    assert (launch.function, param) in WRITE_ONLY, \
                        f"{sub.name}: {launch.label} takes staging {a.field} as {param}"


def _stored_only(fn, param: str) -> bool:
    """Every use of `param` in the Triton function's body is inside the pointer argument of a
    tl.store call."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == param]
    for use in uses:
        node, ok = use, False
        while node in parents:
            parent = parents[node]
            if isinstance(parent, ast.Call) and getattr(parent.func, "attr", "") == "store" \
                    and parent.args and parent.args[0] is node:
                ok = True
                break
            node = parent
        if not ok:
            return False
    return bool(uses)


def test_the_write_only_parameters_are_only_stored_to():
    kernels = {x.function: x for n in profiles.names()
               for s in launches.submissions(profiles.get(n)) for x in s.launches}
    for function, param in sorted(WRITE_ONLY):
        if function in launches.HAND_WRITTEN:
            continue
        launch = kernels[function]
        fn = getattr(importlib.import_module(launch.module), function)
        assert _stored_only(fn, param), f"{function} reads {param} (or never stores through it)"


def _params_loaded(ptx: str) -> set[int]:
    """The parameter indices whose pointers a hand-written kernel loads global memory through:
    registers traced through ld.param, cvta and add to the parameter they came from."""
    origin: dict[str, int] = {}
    loaded = set()
    for line in ptx.splitlines():
        m = re.match(r"\s*([\w.]+)\s+(.*);", line)
        if not m:
            continue
        op, operands = m.group(1), [o.strip() for o in m.group(2).split(",")]
        if op.startswith("ld.param"):
            origin[operands[0]] = int(re.search(r"_param_(\d+)", operands[1]).group(1))
        elif op.startswith(("cvta", "add", "mov.b64", "mov.u64")) and operands[1] in origin:
            origin[operands[0]] = origin[operands[1]]
        elif op.startswith("ld.") and ".global" in op:
            loaded.add(origin[re.match(r"\[(%\w+)", operands[-1]).group(1)])
    return loaded


def test_the_hand_written_kernels_load_only_their_sources():
    """release loads only param 0 (the doorbell: the staged device copy in every final release),
    release_stage_in only params 0 and 2 (the doorbell and the record, in staging)."""
    src = ROOT / "plan" / "kernels"
    assert _params_loaded((src / "release.ptx").read_text()) == {0}
    assert _params_loaded((src / "release_stage_in.ptx").read_text()) == {0, 2}
    for name in profiles.names():
        for sub in launches.submissions(profiles.get(name)):
            last = sub.launches[-1]
            assert last.function == launches.RELEASE
            assert isinstance(last.arg("doorbell_ptr"), launches.BufferRef), sub.name
