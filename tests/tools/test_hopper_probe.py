"""What the pinned Triton offers on sm_90a for TMA, warp specialization and clusters
(tools/hopper_probe.py), held as the facts docs/PERFORMANCE.md's decision rests on: none of it
shares an operand's loads across CTAs, and TMA needs a newer PTX ISA than the project pins.  A
Triton whose answers differ fails here; the section to revisit is named in the message.  And the
interpreter runs tensor-descriptor loads bit for bit as it runs pointer loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tools.build_ptx import PTX_ISA
from tests.support.paths import ROOT

REVISIT = ("the pinned Triton's answer changed: revisit docs/PERFORMANCE.md, \"TMA, warp "
           "specialization and clusters as the pinned Triton offers them\"")


@pytest.fixture(scope="module")
def probed() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "tools.hopper_probe", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    return {x["variant"]: x for x in out["probe"] + out["weight_grad"]}


def _isa(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def test_todays_form_compiles_and_assembles_at_the_pin(probed):
    """The control: pointer loads (every kernel today) compile to wgmma and assemble at the pin."""
    r = probed["pointer loads (today's kernels)"]
    assert r["compiled"] and r["assembles_at_pin"], r
    assert r["wgmma"] > 0 and r["tma_loads"] == 0


def test_warp_specialization_needs_tensor_descriptors(probed):
    ws = probed["pointer loads, warp-specialized"]
    assert not ws["compiled"], REVISIT + f": warp specialization over pointer loads compiles {ws}"
    r = probed["tensor descriptors, warp-specialized"]
    assert r["compiled"], REVISIT + f": {r}"
    # a producer warp group beside consumer groups, registers moved between them
    assert r["num_warps"] > 4 and r["setmaxnreg"], REVISIT + f": {r}"


def test_tma_needs_a_newer_ptx_isa_than_the_pin(probed):
    """Triton's TMA copies (cp.async.bulk.tensor into .shared::cta) and its device-side
    descriptors (tensormap.replace) do not assemble at PTX ISA 8.0, the CUDA 12.0 drivers' pin."""
    for name in ("tensor descriptors", "tensor descriptors, warp-specialized",
                 "tensor descriptors, 2-CTA cluster"):
        r = probed[name]
        assert r["compiled"] and r["tma_loads"] > 0, REVISIT + f": {r}"
        assert r["global_scratch"] > 0             # the descriptor lives in host-supplied scratch
        assert not r["assembles_at_pin"], REVISIT + f": {name} assembles at the pin now"
        assert _isa(r["needs_isa"]) > PTX_ISA, r


def test_a_cluster_shares_no_operand_loads(probed):
    """num_ctas = 2 splits the tile between the two CTAs and exchanges the epilogue through
    distributed shared memory; no operand copy is multicast, so L2 serves every byte as before."""
    for name in ("pointer loads, 2-CTA cluster", "tensor descriptors, 2-CTA cluster"):
        r = probed[name]
        assert r["compiled"] and r["cluster_smem"] > 0, REVISIT + f": {r}"
        assert r["multicast"] == 0, REVISIT + f": {name} multicasts its operands now"


def test_the_weight_gradient_partitions_only_alone_and_then_holds_an_sm(probed):
    """Warp-specialized, the weight gradient with AdamW partitions only as one product a loop (the
    side lane's launches carry two), and then takes a whole SM's registers: one CTA per SM, where
    today's tile keeps two (its AdamW epilogue under the other's K loop)."""
    one = probed["weight gradient + AdamW, 1 product(s), 128 × 128"]
    two = probed["weight gradient + AdamW, 2 product(s), 128 × 128"]
    assert one["compiled"] and one["partitioned"], REVISIT + f": {one}"
    assert one["spill_bytes"] == 0, one
    assert (one["per_sm"], one["limiter"]) == (1, "registers"), REVISIT + f": {one}"
    assert two["compiled"] and not two["partitioned"], REVISIT + f": {two}"


@pytest.mark.parametrize("shape", [(200, 136, 100), (128, 128, 64), (72, 264, 130)])
def test_descriptor_loads_match_pointer_loads_in_the_interpreter(shape):
    """The probe kernel with tensor descriptors (and warp specialization, which the interpreter
    runs as a plain loop) against pointer loads, at two shapes no tile divides and one it does:
    the same bytes."""
    import torch

    from tools.hopper_probe import BLOCK, probe_kernel

    M, N, K = shape
    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(K, M, generator=g).bfloat16()
    b = torch.randn(K, N, generator=g).bfloat16()
    c0 = torch.randn(M, N, generator=g)
    kernel = probe_kernel()
    out = []
    for desc in (False, True):
        c = c0.clone()
        kernel[(3,)](a, b, c, M, N, K, *BLOCK, desc, desc)
        out.append(c.numpy().tobytes())
    assert out[0] == out[1]
    ref = 0.5 * c0.double() + a.double().T @ b.double()
    got = np.frombuffer(out[1], dtype=np.float32).reshape(M, N)
    worst = float(np.abs(got - ref.numpy()).max())
    assert worst < 1e-3 * max(1.0, float(ref.abs().max())), f"worst element off by {worst}"
