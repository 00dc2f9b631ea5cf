"""Judging a case: before the run, the oracle's claims of every sampled program and the watched
memory poisoned (inputs kept); after it, every owned element within its tolerance and written,
and every other watched byte as it was (no stray writes).  Failures name the element."""
from __future__ import annotations

import math

import numpy as np

from coppelius.plan import launches

from tests.support.production.memory import GUARD_ELEMENTS, WATCH_WHOLE_BYTES, Space, byte_runs, merge, runs


# ---------------------------------------------------------------- before the run

def prepare(case, entry) -> None:
    """Ownership and oracle values of every sampled program; poison and snapshot the watch."""
    for pid in case.pids:
        for name, index, want in entry.expect(case, pid):
            if name not in case.outputs:
                raise KeyError(f"{case.launch.kernel}: program {pid} owns {name!r}, "
                               f"which setup did not declare as an output")
            case.claims.append((name, index, np.asarray(want), pid))
    for _, a in case.launch.args:                    # every pointer's buffer, inputs included
        if isinstance(a, (launches.BufferRef, launches.StagingRef)):
            case.space(a)
    for space in case.spaces.values():
        space.watch = _plan_watch(case, space)
        _poison_and_snapshot(case, space)


def _plan_watch(case, space: Space) -> list[tuple[int, int]]:
    """Whole small buffers; else every input and output region (or owned run) ± a guard."""
    if space.total <= WATCH_WHOLE_BYTES:
        return [(0, space.total)]
    g = GUARD_ELEMENTS * 4
    w = [(lo - g, hi + g) for lo, hi in space.inputs]
    for out in case.outputs.values():
        if out.space is not space:
            continue
        g = GUARD_ELEMENTS * out.itemsize
        if out.nbytes <= WATCH_WHOLE_BYTES:
            w.append((out.start - g, out.start + out.nbytes + g))
            continue
        for name, index, _, _ in case.claims:
            if name == out.arg:
                w.extend((a - g, b + g) for a, b in byte_runs(out, index))
    return merge((max(0, lo), min(space.total, hi)) for lo, hi in w)


def _poison_and_snapshot(case, space: Space) -> None:
    """Poison each watched interval except the inputs; keep a copy of the inputs' bytes (the
    rest must still be poison after the run unless owned: no full snapshot is needed)."""
    inputs = merge(space.inputs)
    for lo, hi in space.watch:
        start = lo                                   # poison [lo, hi) around the inputs
        for a, b in inputs:
            if b <= lo or a >= hi:
                continue
            if a > start:
                space.bytes[start:a] = space.poison
            start = max(start, b)
        if start < hi:
            space.bytes[start:hi] = space.poison
    space.saved = [(a, b, space.bytes[a:b].copy()) for a, b in inputs]
    for name, index, _, _ in case.claims:
        out = case.outputs[name]
        if out.space is space:
            for a, b in byte_runs(out, index):
                if not any(lo <= a and b <= hi for lo, hi in space.watch):
                    raise AssertionError(f"{name}: owned bytes [{a}, {b}) of {space.name} "
                                         f"are not inside one watched interval")


# ---------------------------------------------------------------- after the run

def verify(case) -> dict[str, list[str]]:
    """Failures by kind ("values", "unwritten", "stray"), one line each, naming the element."""
    failures: dict[str, list[str]] = {"values": [], "unwritten": [], "stray": []}
    worst: dict[str, tuple] = {}
    scale: dict[str, float] = {}                     # max|want| over every owned region of an output
    for name, _, want, _ in case.claims:
        if want.size and want.dtype.kind == "f":
            scale[name] = max(scale.get(name, 0.0), float(np.abs(want.astype(np.float64)).max()))
    for name, index, want, pid in case.claims:
        out = case.outputs[name]
        msg, ratio, line = _compare(case.values(out, index), want, out.tol, _origin(index),
                                    scale.get(name, 0.0))
        if msg:
            failures["values"].append(f"{name} (program {pid}): {msg}")
        if line and (name not in worst or ratio > worst[name][0]):
            worst[name] = (ratio, line)
        failures["unwritten"].extend(_unwritten(out, index, pid))
    for name, (_, line) in sorted(worst.items()):
        print(f"{case.launch.kernel} {name}: {line}")
    for space in case.spaces.values():
        failures["stray"].extend(_stray(case, space))
    return failures


def _input_mask(space: Space, a: int, b: int) -> np.ndarray:
    """(b − a,) bool: which bytes of [a, b) setup wrote as inputs."""
    mask = np.zeros(b - a, bool)
    for lo, hi in space.inputs:
        if lo < b and hi > a:
            mask[max(lo, a) - a:min(hi, b) - a] = True
    return mask


def _stray(case, space: Space) -> list[str]:
    """Bytes of the watched intervals that changed and no sampled program owns."""
    owned = [r for name, index, _, _ in case.claims if case.outputs[name].space is space
             for r in byte_runs(case.outputs[name], index)]
    out = []
    for lo, hi in space.watch:
        changed = space.bytes[lo:hi] != space.poison
        for a, b, saved in space.saved:
            a2, b2 = max(a, lo), min(b, hi)
            if a2 < b2:
                changed[a2 - lo:b2 - lo] = space.bytes[a2:b2] != saved[a2 - a:b2 - a]
        for a, b in owned:
            if a < hi and b > lo:
                changed[max(a, lo) - lo:min(b, hi) - lo] = False
        stray = np.flatnonzero(changed)
        if stray.size:
            out.append(f"stray write: {stray.size} bytes outside the sampled programs' tiles, "
                       f"first at {space.where(lo + int(stray[0]))}")
    return out


def _unwritten(out, index, pid) -> list[str]:
    """Owned elements still holding their poison (inputs, i.e. accumulated outputs, excepted:
    the oracle sees those)."""
    item = out.itemsize
    for s, e in runs(out.shape, index):
        a, b = out.start + s * item, out.start + e * item
        cur = out.space.bytes[a:b].reshape(-1, item)
        inp = _input_mask(out.space, a, b).reshape(-1, item).any(1)
        bad = np.flatnonzero((cur == out.space.poison).all(1) & ~inp)
        if bad.size:
            where = np.unravel_index(s + int(bad[0]), out.shape)
            return [f"{out.arg} (program {pid}): {bad.size}+ owned elements never written "
                    f"(still poison), first at {tuple(int(i) for i in where)}"]
    return []


def _origin(index) -> tuple:
    """Per indexed axis: ("slice", start) (the axis stays) or ("int", i) (the axis is gone)."""
    index = index if isinstance(index, tuple) else (index,)
    return tuple(("slice", ix.start or 0) if isinstance(ix, slice) else ("int", int(ix))
                 for ix in index)


def _compare(got, want, tol, origin, scale: float):
    """(failure message or "", err/limit, summary line) for one owned region; `scale` is max|want|
    over all the output's owned regions (the kernel tests' max over the expected array)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, oracle {want.shape}", math.inf, ""

    def at(i):
        """The element's index in the output's logical shape."""
        full, k = [], 0
        for kind, o in origin:
            full.append(o if kind == "int" else o + int(i[k]))
            k += kind == "slice"
        full.extend(int(x) for x in i[k:])
        return tuple(full)

    if tol.rel == 0.0:
        same = got.view(np.uint32) == want.astype(got.dtype).view(np.uint32) \
            if got.dtype == np.float32 else got == want
        bad = np.argwhere(~same)
        if bad.size:
            i = tuple(bad[0])
            return (f"{len(bad)} elements differ ({tol.name}), first at {at(i)}: got {got[i]!r}, "
                    f"want {want[i]!r}"), math.inf, ""
        return "", 0.0, f"bit-exact ({tol.name})"
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g64 - w64)
    err[~np.isfinite(g64)] = np.inf
    scale = max(scale, 1e-30)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    limit = tol.rel * scale
    line = (f"worst |err| {err[i]:.3g} at {at(i)} (got {g64[i]:.8g}, want {w64[i]:.8g}), "
            f"scale {scale:.3g}, limit {limit:.3g} ({tol.name})")
    ratio = err[i] / limit if limit else math.inf
    return (line if not err[i] <= limit else ""), ratio, line
