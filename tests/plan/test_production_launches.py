"""Every production launch (each manifest entry of kernels_ptx/coppelius) runs in Triton's
interpreter with its exact constexprs, grid and arguments on the production shapes, for a sample
of its programs, against the numpy reference on exactly the tiles those programs own; outputs
poisoned, no stray writes (tests/support/production/__init__.py says how, and how to extend it)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.support.production.case import Case
from tests.support.production.harness import REGISTRY, SKIPPED, UnknownKernel, check_launch
from tests.support.production.programs import (matmul_pid, matmul_split, matmul_tile, run_programs,
                                 weight_grad_program)

from coppelius.plan import launches, profiles
from coppelius.plan.buffers import BufferSpec, buffers
from coppelius.plan.kernels import meta
from coppelius.plan.ints import cdiv
from tests.support.paths import ROOT

PROFILE = profiles.get("coppelius")
MANIFESTS = sorted((ROOT / "kernels_ptx" / "coppelius").glob("*/manifest.json"))   # per target
KERNELS = launches.kernels(PROFILE)
SPECS = buffers(PROFILE)


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.parent.name for m in MANIFESTS])
def test_manifest_entries_are_the_plan_kernels(manifest):
    """The launches run here are exactly the entries each target compiles (sm_90a, sm_80)."""
    entries = set(json.loads(manifest.read_text())["kernels"])
    plan = set(KERNELS)
    assert entries == plan, (f"manifest only: {sorted(entries - plan)}; "
                             f"plan only: {sorted(plan - entries)}")


def test_the_h200_target_has_a_manifest():
    assert "sm_90a" in [m.parent.name for m in MANIFESTS], f"no sm_90a manifest among {MANIFESTS}"


def test_every_production_function_has_an_oracle_or_a_reason():
    missing = sorted({(l.function, l.kernel) for l in KERNELS.values()
                      if l.function not in REGISTRY and l.function not in SKIPPED})
    assert not missing, f"no oracle in the tests/support/production/ REGISTRY for {missing}"


@pytest.mark.parametrize("kernel", list(KERNELS), ids=[f"{k}-{l.label}" for k, l in KERNELS.items()])
def test_production_launch(kernel):
    launch = KERNELS[kernel]
    if launch.function in SKIPPED:
        pytest.skip(f"{launch.function}: {SKIPPED[launch.function]}")
    report = check_launch(launch, SPECS, PROFILE)
    print(f"{kernel} ({launch.label}): programs {report['pids']} of grid {launch.grid}, "
          f"interpreter {report['run_s']:.2f} s")


def test_an_unknown_function_fails():
    fake = launches.Launch("split_k_0", "coppelius.plan.kernels.matmul", "matmul_split_k", (1, 1, 1), ())
    with pytest.raises(UnknownKernel, match="matmul_split_k"):
        check_launch(fake, SPECS, PROFILE)


# ---------------------------------------------------------------- the harness itself

def _spec(name, dtype, shape):
    return BufferSpec(name, dtype, shape, "test")


def _launch(module, function, grid, args, constexprs, specs):
    """A small Launch over buffers `specs`; args: name → BufferRef | Scalar."""
    return launches.Launch(f"{function}_small", module, function, tuple(grid) + (1,) * (3 - len(grid)),
                           tuple(args.items()), tuple(constexprs.items()))


def test_run_programs_runs_exactly_the_chosen_programs_in_order():
    from coppelius.plan.kernels.copy import copy_f32
    import torch
    src = torch.arange(10 * 16, dtype=torch.float32)
    dst = torch.full((10 * 16 + 5,), float("nan"))
    run_programs(copy_f32, (10,), [7, 0, 9], [src, dst, 10 * 16], {"BLOCK": 16})
    written = sorted({int(i) // 16 for i in np.flatnonzero(~torch.isnan(dst).numpy())})
    assert written == [0, 7, 9]
    assert torch.equal(dst[:16], src[:16]) and torch.equal(dst[144:160], src[144:160])
    with pytest.raises(ValueError, match="outside grid"):
        run_programs(copy_f32, (10,), [10], [src, dst, 160], {"BLOCK": 16})


def test_a_pointer_without_its_offset_fails(monkeypatch):
    """out_proj writes residual slab 1 (an element offset into `resid`): handed the buffer base
    instead, the kernel overwrites slab 0 (its own residual input: a stray write) and the owned
    tiles of slab 1 stay poison."""
    launch = next(l for l in KERNELS.values() if l.label == "layers.0.out_proj")
    assert launch.arg("out_ptr").offset == PROFILE.context * PROFILE.width
    resolve = Case.resolve

    def base_only(case, arg):
        if arg is launch.arg("out_ptr"):
            arg = launches.BufferRef(arg.buffer, 0, arg.dtype)
        return resolve(case, arg)

    monkeypatch.setattr(Case, "resolve", base_only)
    with pytest.raises(AssertionError) as err:
        check_launch(launch, SPECS, PROFILE)
    assert "stray write" in str(err.value) and "resid element 0 (0, 0, 0)" in str(err.value)
    assert "out_ptr (program 0): 64+ owned elements never written" in str(err.value)


def test_a_stray_write_and_an_unwritten_tile_fail():
    """Claim the wrong tile for a program: its real tile is a stray write, the claimed one unwritten."""
    M, N, K = 64, 48, 32
    specs = {"a": _spec("a", "bf16", (M, K)), "b": _spec("b", "bf16", (N, K)),
             "c": _spec("c", "fp32", (M, N))}
    launch = _launch("coppelius.plan.kernels.matmul", "matmul", (4 * 3,),
                     {"a_ptr": launches.BufferRef("a", 0, "bf16"), "b_ptr": launches.BufferRef("b", 0, "bf16"),
                      "c_ptr": launches.BufferRef("c", 0, "fp32"), "aux_ptr": launches.BufferRef("c", 0, "fp32"),
                      "M": launches.Scalar("i32", M), "N": launches.Scalar("i32", N),
                      "K": launches.Scalar("i32", K)},
                     {"A_T": False, "B_T": True, "EPILOGUE": meta.EPI_F32, "SPLIT_K": 1,
                      "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, specs)
    entry = REGISTRY["matmul"]
    real = entry.expect

    def shifted(case, pid):                     # program 3's tile, claimed for program 0
        yield from real(case, 3 if pid == 0 else pid)

    entry.expect = shifted
    try:
        with pytest.raises(AssertionError) as err:
            check_launch(launch, specs, pids=[0])
    finally:
        entry.expect = real
    assert "stray write" in str(err.value) and "never written" in str(err.value)


def _matmul_small(M, N, K, bm, bn, g, slab, splits=1):
    """matmul at an awkward size writing slab 1 of a 3-slab buffer (an offset as in the plan);
    with splits > 1 its (splits, M, N) partials from there."""
    specs = {"a": _spec("a", "bf16", (K, M)), "b": _spec("b", "bf16", (K, N)),
             "c": _spec("c", "fp32", (3 + splits, M, N))}
    return _launch("coppelius.plan.kernels.matmul", "matmul", (cdiv(M, bm) * cdiv(N, bn) * splits,),
                   {"a_ptr": launches.BufferRef("a", 0, "bf16"), "b_ptr": launches.BufferRef("b", 0, "bf16"),
                    "c_ptr": launches.BufferRef("c", slab * M * N, "fp32"),
                    "aux_ptr": launches.BufferRef("c", 0, "fp32"),
                    "M": launches.Scalar("i32", M), "N": launches.Scalar("i32", N),
                    "K": launches.Scalar("i32", K)},
                   {"A_T": True, "B_T": False, "EPILOGUE": meta.EPI_F32, "SPLIT_K": splits,
                    "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": g}, specs), specs


def test_matmul_tile_mapping_is_the_kernels():
    """Each program of a grid with a ragged last group (5 row tiles, GROUP_M 2), run alone,
    writes exactly the tile matmul_tile names, at the slab offset."""
    M, N, K, bm, bn, g = 75, 40, 48, 16, 16, 2
    launch, specs = _matmul_small(M, N, K, bm, bn, g, slab=1)
    tiles = [matmul_tile(p, M, N, bm, bn, g) for p in range(launch.grid[0])]
    assert sorted(tiles) == [(i, j) for i in range(5) for j in range(3)]
    assert all(matmul_pid(*t, M, N, bm, bn, g) == p for p, t in enumerate(tiles))
    for pid in range(launch.grid[0]):
        check_launch(launch, specs, pids=[pid])


def test_split_k_matmul_mapping_is_the_kernels():
    """Split-K: 5 K chunks over 3 splits (2, 2, 1); each program run alone writes its
    tile of its split's partial, at the slab offset."""
    M, N, K, bm, bn, g, S = 75, 40, 160, 16, 16, 2, 3
    launch, specs = _matmul_small(M, N, K, bm, bn, g, slab=1, splits=S)
    ks = [matmul_split(p, M, N, K, bm, bn, 32, S)[1] for p in range(launch.grid[0])]
    assert {(k.start, k.stop) for k in ks} == {(0, 64), (64, 128), (128, 160)}
    for pid in range(launch.grid[0]):
        check_launch(launch, specs, pids=[pid])


def test_weight_grad_program_mapping_is_the_kernels():
    """Two products' 9 tiles over 5 programs (the side lane's launch): program p runs tiles
    p, p + 5, … across the products' boundary; each program run alone updates exactly the
    P/M/V/w16 tiles the mapping names."""
    T, (M0, N0), (M1, N1), bm, bn, grid = 40, (36, 20), (16, 48), 16, 16, 5
    off0, off1 = 8, 8 + M0 * N0 + 8
    n = off1 + M1 * N1 + 8
    specs = {"a0": _spec("a0", "bf16", (T, M0)), "b0": _spec("b0", "bf16", (T, N0)),
             "a1": _spec("a1", "bf16", (T, M1)), "b1": _spec("b1", "bf16", (T, N1)),
             "pmv": _spec("pmv", "fp32", (3, n)), "w16": _spec("w16", "bf16", (n,)),
             "staged": _spec("staged", "u32", (4,))}
    ref_ = launches.BufferRef
    args = {"a0_ptr": ref_("a0", 0, "bf16"), "b0_ptr": ref_("b0", 0, "bf16"),
            "p0_ptr": ref_("pmv", off0), "h0_ptr": ref_("w16", off0, "bf16"),
            "a1_ptr": ref_("a1", 0, "bf16"), "b1_ptr": ref_("b1", 0, "bf16"),
            "p1_ptr": ref_("pmv", off1), "h1_ptr": ref_("w16", off1, "bf16"),
            "doorbell_ptr": ref_("staged", 1, "u32"), "t_base": launches.RunScalar("t_base", "i64")}
    args |= {k: launches.Scalar("i32", v) for k, v in
             (("M0", M0), ("N0", N0), ("M1", M1), ("N1", N1), ("T", T), ("NPARAM", n))}
    from coppelius.plan.launches import builders as launch_builders
    tiles = [cdiv(M0, bm) * cdiv(N0, bn), cdiv(M1, bm) * cdiv(N1, bn)]
    launch = _launch("coppelius.plan.kernels.weight_grad", "weight_grad", (grid,), args,
                     {"PRODUCTS": 2, **launch_builders.learner_constexprs(PROFILE),
                      "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 16, "GROUP_M": 2}, specs)
    owned = [weight_grad_program(p, tiles, grid) for p in range(grid)]
    assert tiles == [6, 3] and [len(o) for o in owned] == [2, 2, 2, 2, 1]
    assert owned[1] == [(0, 1), (1, 0)]              # crosses into product 1
    assert sorted(sum(owned, [])) == [(0, t) for t in range(6)] + [(1, t) for t in range(3)]
    for pid in range(grid):
        check_launch(launch, specs, PROFILE, pids=[pid])


ATTENTION_ARGS = {   # the builders' pointer arguments (plan/launches/builders.py), in order
    "attention_fwd": ("qkv", "o16", "o32", "lse"),
    "attention_bwd": ("qkv", "do", "lse", "delta", "kv_part", "ds"),
    "attention_bwd_dq": ("qkv", "ds", "kv_part", "rope", "dqkv"),
}


@pytest.mark.parametrize("function", list(ATTENTION_ARGS))
def test_attention_program_mapping_is_the_kernels(function):
    """Each program of a small attention launch (the forward's key block twice its query block,
    so that a short row's last keys are masked; ragged dK/dV chunks that cross query heads,
    BLOCK_M = 2·BLOCK_N), run alone, writes exactly what plan/attention_split.py says it owns."""
    from coppelius.plan.attention_split import AttentionSplit
    T, H, G, d, bm, bn, fn, bc = 64, 4, 2, 16, 32, 16, 64, 3
    sp = AttentionSplit(T, bm, bn, H, G, fn, bc)
    W = (H + 2 * G) * d
    shapes = {"qkv": ("bf16", (T, W)), "o16": ("bf16", (T, H * d)),
              "o32": ("fp32", (T, H * d)), "lse": ("fp32", (H, T)), "do": ("fp32", (T, H * d)),
              "delta": ("fp32", (H, T)), "kv_part": ("fp32", (sp.bwd_slots, T, 2 * G * d)),
              "ds": ("bf16", (H, T, T)), "rope": ("fp32", (T, d)), "dqkv": ("bf16", (T, W))}
    specs = {n: _spec(n, *shapes[n]) for n in ATTENTION_ARGS[function]}
    args = {f"{n}_ptr": launches.BufferRef(n, 0, specs[n].dtype) for n in ATTENTION_ARGS[function]}
    args["T"] = launches.Scalar("i32", T)
    consts = {"SCALE": 0.25, "HEADS": H, "KV_HEADS": G, "HEAD_DIM": d, "BLOCK_M": bm,
              "BLOCK_N": fn if function == "attention_fwd" else bn, "BWD_CHUNK": bc}
    keep = {"attention_fwd": ("SCALE", "HEADS", "KV_HEADS", "HEAD_DIM", "BLOCK_M", "BLOCK_N"),
            "attention_bwd": ("SCALE", "HEADS", "KV_HEADS", "HEAD_DIM", "BLOCK_M", "BLOCK_N", "BWD_CHUNK"),
            "attention_bwd_dq": ("HEADS", "KV_HEADS", "HEAD_DIM", "BLOCK_M", "BLOCK_N", "BWD_CHUNK")}
    n = {"attention_fwd": len(sp.fwd_programs()), "attention_bwd": len(sp.dkdv_programs()),
         "attention_bwd_dq": len(sp.dq_programs())}[function]
    launch = _launch("coppelius.plan.kernels.attention", function, (n,), args,
                     {k: consts[k] for k in keep[function]}, specs)
    if function == "attention_fwd":
        assert [sp.fwd_trips(m) for m, _ in sp.fwd_programs()[::H]] == [1, 1]
    if function == "attention_bwd":
        assert any(len({j for j, _ in sp.dkdv_chunk_pairs(b, c)}) > 1 for b, c, _ in sp.dkdv_programs())
        assert any(len(sp.dkdv_chunk_pairs(b, c)) < bc for b, c, _ in sp.dkdv_programs())
    for pid in range(n):
        check_launch(launch, specs, pids=[pid])


def test_rmsnorm_bwd_gain_program_mapping_is_the_kernels():
    T, D = 10, 48
    specs = {n: _spec(n, "fp32", shape) for n, shape in
             (("dy", (T, D)), ("x", (T, D)), ("rstd", (T,)), ("g", (D,)), ("dx", (T, D)), ("dg", (2, D)))}
    specs["dx16"] = _spec("dx16", "bf16", (T, D))
    args = {f"{n}_ptr": launches.BufferRef(n, 0, specs[n].dtype) for n in
            ("dy", "x", "rstd", "g", "dx", "dx16")}
    args["dg_ptr"] = launches.BufferRef("dg", D, "fp32")             # slab 1: an offset
    args["T"] = launches.Scalar("i32", T)
    launch = _launch("coppelius.plan.kernels.norms", "rmsnorm_bwd_gain", (3 + 3,), args,
                     {"D": D, "WRITE_BF16": True, "BLOCK_R": 4, "BLOCK_D": 64, "GAIN_ROWS": 4,
                      "GAIN_COLS": 16, "DY_PARTS": 1}, specs)
    for pid in range(6):
        check_launch(launch, specs, pids=[pid])
