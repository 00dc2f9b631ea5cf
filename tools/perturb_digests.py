"""`coppelius run … --digests FILE` with one launch's output perturbed in the digest replay: the
bisect's demonstration and its tests (README: "Which kernel diverged").

  python -m tools.perturb_digests --launch layers.0.mlp.swiglu run --profile tiny \\
      --backend interpret --steps 1 --digests perturbed.json [the rest of `coppelius run`]

After the chosen launch runs alone in the replay (host/run/digest_replay.py), one element of one of its
write regions is multiplied by `--factor` (by default the sampled element of largest |x| of its
first compared write, doubled) before the writes are summarized, so every later launch sees it: a
stand-in for a kernel that computes one wrong value.  The issued step and the run's result file are
untouched (the replay's state is discarded); the file says its replay differs from its issued
step.  A hook of the run request, never of the command line.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from coppelius.cli import run as cmd_run
from coppelius.results import digests
from coppelius.staging.errors import UserError

DEFAULT_FACTOR = 2.0


def _element(values: np.ndarray, element: int | None) -> int:
    """The element to perturb: the one asked, else the sampled one of largest finite |x|."""
    if element is not None:
        if not 0 <= element < values.size:
            raise ValueError(f"element {element} outside the region's {values.size} elements")
        return element
    idx = digests.sample_indices(values.size)
    mags = np.nan_to_num(np.abs(values[idx].astype(np.float64)), nan=-1.0, posinf=-1.0)
    return int(idx[int(np.argmax(mags))])


def perturbation(label: str, factor: float = DEFAULT_FACTOR, write: int = 0,
                 element: int | None = None):
    """A replay hook (host/run/digest_replay.replay's `perturb`): after launch `label`, element
    `element` of its `write`-th compared write region multiplied by `factor` in that region's
    dtype.  The hook's `.done` lists (label, region name, element, old value, new value)."""
    done = []

    def hook(backend, index, launch, regions):
        if launch.label != label:
            return
        compared = [r for r in regions.writes if not r.volatile]
        r = compared[write]
        if r.dtype not in ("fp32", "bf16"):
            raise ValueError(f"{label}: write {r.name} is {r.dtype}; perturb a float region")
        v = digests.values(r.dtype, backend.read_region(r))
        e = _element(v, element)
        new = np.float32(v[e] * np.float32(factor))
        bits = new.view(np.uint32)
        raw = (np.array([bits >> np.uint32(16)], np.uint16).view(np.uint8) if r.dtype == "bf16"
               else np.array([new], np.float32).view(np.uint8))
        at = r.offset + (e // r.run) * r.stride + e % r.run         # the element in its space
        backend.write_bytes(r.space, at * r.itemsize, raw)
        done.append((label, r.name, e, float(v[e]), float(digests.values(r.dtype, raw)[0])))

    hook.done = done
    return hook


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.perturb_digests",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--launch", required=True, help="the label of the launch to perturb "
                    "(`coppelius bisect` and the digests file name them)")
    ap.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                    help=f"what the element is multiplied by (default {DEFAULT_FACTOR:g})")
    ap.add_argument("--write", type=int, default=0, help="which of its compared writes (default 0)")
    ap.add_argument("--element", type=int, help="which element (default: the sampled one of "
                    "largest |x|)")
    sub = ap.add_subparsers(dest="command", metavar="run", required=True)
    cmd_run.register(sub)
    args = ap.parse_args(argv)
    if args.digests is None:
        ap.error("name the digests file: run ... --digests FILE")
    hook = perturbation(args.launch, args.factor, args.write, args.element)
    args.digest_perturb = hook
    try:
        rc = cmd_run.run(args)
    except UserError as e:
        print(f"perturb_digests: {e}", file=sys.stderr)
        return e.exit_code
    if not hook.done:
        print(f"perturb_digests: no launch labelled {args.launch!r} ran in the replay",
              file=sys.stderr)
        return 2
    for label, name, e, old, new in hook.done:
        print(f"perturbed {label} {name} element {e}: {old:.9g} → {new:.9g}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
