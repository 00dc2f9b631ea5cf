"""The cuda backend's own path computing on the CPU: the executing fake driver
(tools/fake_driver.py with tools/cpu_cuda/executor.py) against the interpret backend, tensor by
tensor, bit for bit; the graph's nodes in adversarial orders of the captured edges; and mutations
of what the host hands the driver, each caught and named.

Both backends start from the state a fresh `coppelius run` on the embedded stream reaches before
its forward issue (tests/support/digest_support.py) and issue the forward, then the update; after
each, every device buffer of plan/buffers.py and the staging records the result file is made of
must be the same bytes (the first differing element is printed).  The interpret backend is one
module-scoped reference.  The mutations are applied here (a monkeypatch, or the backend under test
changed before its capture), never in the product:
  * two pointer parameters of one kernel swapped in the host's packing → memcheck names the
    kernel, the parameter and the offset (CUDA_ERROR_ILLEGAL_ADDRESS);
  * a grid one CTA short → the forward's buffers differ (the first differing buffer named);
  * a manifest constexpr changed → its kernel's output differs;
  * a parameter 16 bytes off its `divisible_by_16` alignment → the launch fails naming both;
  * one captured edge dropped → the update under the order that exploits it differs.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np
import pytest

from coppelius.backends.cuda.backend import CudaBackend
from coppelius.driver import calls as drv
from coppelius.errors import DeviceError
from coppelius.plan import launches as _launches
from coppelius.plan.buffers import buffers as plan_buffers
from coppelius.staging import layout as L
from tests.support import digest_support as DS
from tools.cpu_cuda import executor as EX
from tools.fake_driver import FakeDriver

PROFILE = DS.PROFILE
STAGED = ("record_forward", "predictions", "loss_record", "record_final")


def snapshot(be) -> dict[str, np.ndarray]:
    """Every device buffer's bytes and the staging records the result file is made of."""
    out = {name: be.read_bytes(name, 0, spec.nbytes)
           for name, spec in plan_buffers(PROFILE).items()}
    for name in STAGED:
        out[f"staging.{name}"] = np.asarray(getattr(be.staging, name)).view(np.uint8).copy()
    return out


def first_difference(a: dict, b: dict) -> str | None:
    """'' where every tensor is the same bytes; else the first differing tensor, its element
    count differing and the first element (as fp32 words where the size allows)."""
    for name in a:
        x, y = a[name], b[name]
        if x.tobytes() == y.tobytes():
            continue
        words = x.size % 4 == 0
        xa, ya = (x.view(np.uint32), y.view(np.uint32)) if words else (x, y)
        bad = np.flatnonzero(xa != ya)
        i = int(bad[0])
        shown = (f"{xa[i:i + 1].view(np.float32)[0]!r} vs {ya[i:i + 1].view(np.float32)[0]!r}"
                 if words else f"{xa[i]} vs {ya[i]}")
        return f"{name}: {bad.size} of {xa.size} elements differ, first [{i}]: {shown}"
    return None


@contextmanager
def executing_fake(order: str = "capture", executor_index=None):
    """A FakeDriver that executes every launch, installed as the driver for the block."""
    mp = pytest.MonkeyPatch()
    fake = FakeDriver(execute=executor_index is None, order=order)
    if executor_index is not None:
        fake.executor = EX.Executor(fake, index=executor_index)
    mp.setattr(drv, "_cu", fake)
    try:
        yield fake
    finally:
        mp.undo()


def prepared(be, directory):
    """`be` in the state digest_support.before_forward leaves an interpret backend."""
    return DS.before_forward(directory, backend=be)


def issue(be, submission: int, sequence: int) -> dict:
    be.staging.doorbell[0] = sequence
    be.issue(submission)
    be.synchronize()
    if be.check() is False:
        raise DeviceError("the device reported a fault")
    return snapshot(be)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The interpret backend's forward and update."""
    d = tmp_path_factory.mktemp("interpret")
    be = DS.before_forward(d)
    forward = issue(be, L.SUBMISSION_FORWARD, DS.FORWARD_SEQUENCE)
    update = issue(be, L.SUBMISSION_UPDATE, DS.UPDATE_SEQUENCE)
    return d, forward, update


def cuda_forward(directory, mutate=None, **fake_options) -> dict:
    """The forward issued on the executing fake driver: its tensors (the backend closed);
    `mutate(be)` runs before the graphs are captured."""
    with executing_fake(**fake_options):
        be = CudaBackend(PROFILE)
        try:
            if mutate is not None:
                mutate(be)
            prepared(be, directory)
            return issue(be, L.SUBMISSION_FORWARD, DS.FORWARD_SEQUENCE)
        finally:
            be.close()


def cuda_forward_and_update(directory, mutate=None, order="capture"):
    with executing_fake(order=order) as fake:
        be = CudaBackend(PROFILE)
        try:
            if mutate is not None:
                mutate(be)
            prepared(be, directory)
            forward = issue(be, L.SUBMISSION_FORWARD, DS.FORWARD_SEQUENCE)
            update = issue(be, L.SUBMISSION_UPDATE, DS.UPDATE_SEQUENCE)
            return forward, update, fake
        finally:
            be.close()


@pytest.mark.parametrize("order", ["earliest", "latest"])
def test_the_update_is_the_interpret_bits_in_every_order_of_the_captured_edges(reference, order):
    """Each side-lane node as early as the captured edges allow, and as late: every valid order
    gives the interpret backend's bytes, tensor by tensor (the capture order itself:
    tests/tools/test_cpu_cuda.py, whole runs)."""
    d, forward, update = reference
    f, u, fake = cuda_forward_and_update(d, order=order)
    assert fake.executor.launches > 0
    assert first_difference(forward, f) is None, first_difference(forward, f)
    assert first_difference(update, u) is None, first_difference(update, u)


def test_a_random_order_of_the_forward_is_the_same_bits(reference):
    d, forward, _ = reference
    f = cuda_forward(d, order="random:2026")
    assert first_difference(forward, f) is None, first_difference(forward, f)


def _side_launch_with_a_main_edge(be) -> tuple[int, int]:
    """(i, j): the update's first side-lane launch with an edge from a main-lane launch j."""
    sub = be._submissions[L.SUBMISSION_UPDATE]
    for i, launch in enumerate(sub.launches):
        mains = [j for j in sub.deps[i] if sub.launches[j].lane == _launches.MAIN_LANE]
        if launch.lane == _launches.SIDE_LANE and mains:
            return i, max(mains)
    raise AssertionError("the update has no side-lane launch waiting for the main lane")


def test_a_dropped_captured_edge_shows_as_different_bits(reference):
    """The capture without one edge the plan needs (a side-lane weight gradient's wait for the
    main-lane launch it reads after): the order that runs the side lane first computes it
    before its input exists, and the update's bytes differ — the order test can fail."""
    d, _, update = reference
    dropped = {}

    def drop_edge(be):
        i, j = _side_launch_with_a_main_edge(be)
        sub = be._submissions[L.SUBMISSION_UPDATE]
        deps = list(sub.deps)
        deps[i] = type(sub.deps[i])(k for k in sub.deps[i] if k != j)
        _replace_submission(be, L.SUBMISSION_UPDATE,
                            dataclasses.replace(sub, deps=type(sub.deps)(deps)))
        dropped["edge"] = (sub.launches[j].label, sub.launches[i].label)

    _, u, _ = cuda_forward_and_update(d, mutate=drop_edge, order="earliest")
    diff = first_difference(update, u)
    assert diff is not None, f"dropping {dropped['edge']} changed nothing under 'earliest'"
    print(f"edge {dropped['edge']} dropped: {diff}")


def _with_args(launch, swap: dict):
    """`launch` with some arguments replaced: {name: the other argument's name or a ref}."""
    args = dict(launch.args)
    return dataclasses.replace(launch, args=tuple(
        (name, args[swap[name]] if isinstance(swap.get(name), str) else swap.get(name, ref))
        for name, ref in launch.args))


def test_swapped_pointer_parameters_are_caught_by_memcheck_naming_kernel_and_offset(
        reference, monkeypatch, capfd):
    """The host's packing of the last layer's attention with q|k|v (T × (H + 2G)·d a layer) and
    its output o (T × H·d a layer) swapped: its reads of q|k|v run off the end of o's smaller
    allocation (layer 0's would not: its q|k|v slice is o's whole size), the launch faults as
    CUDA_ERROR_ILLEGAL_ADDRESS, and the report names the kernel, the parameter and the offset;
    the run stops there."""
    d, _, _ = reference
    packed = CudaBackend.packed
    swapped = []

    def swap(self, launch, t_base):
        if launch.label == f"layers.{PROFILE.layers - 1}.attention":
            swapped.append(launch.label)
            launch = _with_args(launch, {"qkv_ptr": "o16_ptr", "o16_ptr": "qkv_ptr"})
        return packed(self, launch, t_base)

    monkeypatch.setattr(CudaBackend, "packed", swap)
    with pytest.raises(DeviceError):
        cuda_forward(d)
    err = capfd.readouterr().err
    assert swapped, "the attention launch was not packed"
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "attention_fwd" in err, err[-2000:]
    assert "parameter qkv_ptr" in err and "offset +" in err, err[-2000:]


def _replace_submission(be, index: int, sub) -> None:
    """The backend's submission `index` replaced before its graphs are captured."""
    subs = list(be._submissions)
    subs[index] = sub
    be._submissions = type(be._submissions)(subs)
    be.capture.submissions = be._submissions


def test_a_grid_one_cta_short_leaves_a_tile_unwritten(reference):
    """The head's grid one CTA short as captured: its last tile of logits keeps the poison, and
    the forward's tensors differ from the interpret backend's (the first differing one named)."""
    d, forward, _ = reference
    shortened = []

    def short(be):
        sub = be._submissions[L.SUBMISSION_FORWARD]
        launches = list(sub.launches)
        k = next(i for i, x in enumerate(launches) if x.label == "head")
        shortened.append(launches[k].grid)
        launches[k] = dataclasses.replace(launches[k], grid=(launches[k].grid[0] - 1,
                                                             *launches[k].grid[1:]))
        _replace_submission(be, L.SUBMISSION_FORWARD, dataclasses.replace(
            sub, launches=type(sub.launches)(launches)))

    f = cuda_forward(d, mutate=short)
    assert shortened and shortened[0][0] > 1, shortened
    diff = first_difference(forward, f)
    assert diff is not None and diff.startswith("logits"), diff
    print(f"head grid {shortened[0]} less one CTA: {diff}")


def test_a_changed_manifest_constexpr_is_caught_by_the_bits(reference):
    """The committed manifest's embedding kernel with BLOCK_R (rows per program) halved — what
    the PTX was built from no longer what the CPU twin computes: half the rows go unwritten and
    the forward differs from the interpret backend's."""
    d, forward, _ = reference
    index = EX.manifest_index()
    changed = []
    for entries in index.values():
        for k, e in enumerate(entries):
            if e.function == "embed_fwd":
                rows = e.constexprs["BLOCK_R"]
                entries[k] = dataclasses.replace(e, constexprs={**e.constexprs,
                                                                "BLOCK_R": rows // 2})
                changed.append(e.key)
    assert changed, "no embed_fwd entry in the manifests"
    f = cuda_forward(d, executor_index=index)
    diff = first_difference(forward, f)
    assert diff is not None, f"{changed}: BLOCK_R halved and the forward did not change"
    print(f"BLOCK_R halved in {changed}: {diff}")


def test_a_parameter_off_its_16_byte_alignment_fails_the_launch_naming_it(reference,
                                                                          monkeypatch, capfd):
    """Layer 0's attention handed o32 4 bytes past its start, where the PTX was specialized on
    its being divisible by 16 (the manifest's `divisible_by_16`): the launch fails with
    CUDA_ERROR_MISALIGNED_ADDRESS naming the kernel and the parameter — a GPU would not say."""
    d, _, _ = reference
    packed = CudaBackend.packed
    moved = []

    def off(self, launch, t_base):
        if launch.label == "layers.0.attention":
            ref = dict(launch.args)["o32_ptr"]
            moved.append(ref)
            launch = _with_args(launch, {"o32_ptr": dataclasses.replace(
                ref, offset=ref.offset + 1)})
        return packed(self, launch, t_base)

    monkeypatch.setattr(CudaBackend, "packed", off)
    with pytest.raises(DeviceError):
        cuda_forward(d)
    err = capfd.readouterr().err
    assert moved, "the attention launch was not packed"
    assert "attention_fwd" in err and "parameter o32_ptr" in err, err[-2000:]
    assert "not divisible by 16" in err and "divisible_by_16" in err, err[-2000:]
